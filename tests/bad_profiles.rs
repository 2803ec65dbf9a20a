//! Invalid profiles are refused with the right reason, naming the profile, the rule and the GPU
//! model. Each case is one distinct mistake a user can make; the expected sentences are the ones
//! the CLI prints. Where a rule comes from the NVIDIA device plugin, its own wording is quoted
//! (docs/sources.md#device-plugin-refusals).

use gpu_share::plan::{plan, ObservedNode};
use gpu_share::profile::{read_profiles, Problem, Severity};
use gpu_share::validate::validate;

/// The problems `gpu-share validate` reports for one profile file's text.
fn problems(text: &str) -> Vec<Problem> {
    let mut all = read_profiles("bad", text);
    assert_eq!(all.len(), 1);
    match all.remove(0).profile {
        Ok(profile) => validate("bad", &profile),
        Err(problem) => vec![problem],
    }
}

/// Exactly one error, whose text contains `needle`, on rule `rule` and GPU `gpu` (if given).
fn assert_one_error(text: &str, rule: Option<usize>, gpu: Option<&str>, needle: &str) {
    let errors: Vec<Problem> = problems(text)
        .into_iter()
        .filter(|p| p.severity == Severity::Error)
        .collect();
    assert_eq!(
        errors.len(),
        1,
        "expected one error for:\n{text}\ngot: {errors:#?}"
    );
    let e = &errors[0];
    assert_eq!(e.profile, "bad");
    assert_eq!(e.rule.as_ref().map(|r| r.number), rule, "{e}");
    assert_eq!(e.gpu.as_deref(), gpu, "{e}");
    assert!(
        e.to_string().contains(needle),
        "{e}\n  does not contain: {needle}"
    );
}

#[test]
fn malformed_yaml() {
    assert_one_error(
        "version: v1\nrules: [{devices: all, timeSlicing: {replicas: 4}\n",
        None,
        None,
        "not valid YAML: did not find expected ',' or '}' at line 3 column 1",
    );
}

#[test]
fn unknown_top_level_field() {
    assert_one_error(
        "version: v1\nsharing: {}\nrules: [{devices: all, exclusive: true}]\n",
        None,
        None,
        "unknown field `sharing`, expected one of `version`, `description`, `plugin`, `rules`",
    );
}

#[test]
fn misspelt_field_inside_a_mode() {
    assert_one_error(
        "version: v1\nrules:\n  - devices: all\n    timeSlicing: {replica: 4}\n",
        None,
        None,
        "unknown field `replica`, expected `replicas` at line 4",
    );
}

#[test]
fn misplaced_plugin_option() {
    // The NVIDIA plugin silently drops `renameByDefault` under `flags:` (DP#1433); we refuse.
    assert_one_error(
        "version: v1\nplugin: {flags: {renameByDefault: true}}\nrules: [{devices: all, exclusive: true}]\n",
        None,
        None,
        "unknown field `flags`",
    );
}

#[test]
fn zero_replicas() {
    assert_one_error(
        "version: v1\nrules: [{devices: all, timeSlicing: {replicas: 0}}]\n",
        Some(1),
        None,
        "timeSlicing.replicas is 0, but the number of replicas must be >= 2",
    );
}

#[test]
fn negative_replicas() {
    assert_one_error(
        "version: v1\nrules: [{devices: all, mps: {replicas: -4}}]\n",
        Some(1),
        None,
        "mps.replicas is -4, but the number of replicas must be >= 2",
    );
}

#[test]
fn one_replica_is_not_sharing() {
    assert_one_error(
        "version: v1\nrules: [{devices: all, timeSlicing: {replicas: 1}}]\n",
        Some(1),
        None,
        "use `exclusive: true`",
    );
}

#[test]
fn mps_beyond_the_server_client_limit() {
    assert_one_error(
        "version: v1\nrules: [{devices: all, mps: {replicas: 64}}]\n",
        Some(1),
        None,
        "an MPS server takes at most 48 clients per GPU",
    );
}

#[test]
fn mps_thread_percentage_out_of_range() {
    assert_one_error(
        "version: v1\nrules: [{devices: all, mps: {replicas: 4, activeThreadPercentage: 150}}]\n",
        Some(1),
        None,
        "mps.activeThreadPercentage is 150, but it must be between 1 and 100",
    );
}

#[test]
fn mig_profile_the_model_lacks() {
    assert_one_error(
        "version: v1\nrules:\n  - devices: {product: NVIDIA H200}\n    mig: {1g.10gb: 2}\n",
        Some(1),
        Some("NVIDIA H200"),
        "this model has no MIG profile \"1g.10gb\"; it has 1g.18gb, 1g.18gb+me, 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb",
    );
}

#[test]
fn mig_profile_no_model_has() {
    assert_one_error(
        "version: v1\nrules: [{devices: all, mig: {1g.11gb: 1}}]\n",
        Some(1),
        None,
        "1g.11gb exists on no known model",
    );
}

#[test]
fn not_a_mig_profile_name() {
    assert_one_error(
        "version: v1\nrules: [{devices: all, mig: {mig-1g.10gb: 1}}]\n",
        Some(1),
        None,
        "\"mig-1g.10gb\" is not a MIG profile name",
    );
}

#[test]
fn too_many_instances_of_one_profile() {
    assert_one_error(
        "version: v1\nrules:\n  - devices: {product: NVIDIA H100 80GB HBM3}\n    mig: {3g.40gb: 3}\n",
        Some(1),
        Some("NVIDIA H100 80GB HBM3"),
        "3 × 3g.40gb asked, but at most 2 instances of 3g.40gb can exist at once",
    );
}

#[test]
fn too_many_compute_slices() {
    assert_one_error(
        "version: v1\nrules:\n  - devices: {product: NVIDIA A100-SXM4-40GB}\n    mig: {4g.20gb: 1, 2g.10gb: 2}\n",
        Some(1),
        Some("NVIDIA A100-SXM4-40GB"),
        "too many compute slices: the instances need 8, the GPU has 7",
    );
}

#[test]
fn too_much_memory() {
    // 3 × 2 + 4 = 10 memory slices, 6 compute slices: memory runs out first.
    assert_one_error(
        "version: v1\nrules:\n  - devices: {product: NVIDIA H100 80GB HBM3}\n    mig: {1g.20gb: 3, 3g.40gb: 1}\n",
        Some(1),
        Some("NVIDIA H100 80GB HBM3"),
        "too much memory: the instances need 10 of the GPU's 8 memory slices (100736 MiB of 81559 MiB)",
    );
}

#[test]
fn too_many_instances_on_the_gpu() {
    assert_one_error(
        "version: v1\nrules:\n  - devices: {product: NVIDIA A30}\n    mig: {1g.6gb: 4, 1g.6gb+me: 1}\n",
        Some(1),
        Some("NVIDIA A30"),
        "5 MIG instances asked, but this GPU holds at most 4",
    );
}

#[test]
fn overlapping_index_selectors() {
    assert_one_error(
        "version: v1\nrules:\n  - {devices: [\"0-3\"], mig: {1g.10gb: 7}}\n  - {devices: [3, 4], timeSlicing: {replicas: 2}}\n",
        Some(2),
        None,
        "its devices overlap rule 1's: both select GPU 3; a GPU takes exactly one rule",
    );
}

#[test]
fn all_overlaps_everything() {
    assert_one_error(
        "version: v1\nrules:\n  - {devices: all, exclusive: true}\n  - {devices: {product: \"NVIDIA H100*\"}, exclusive: true}\n",
        Some(2),
        None,
        "`all` selects every GPU",
    );
}

#[test]
fn overlapping_product_selectors() {
    assert_one_error(
        "version: v1\nrules:\n  - {devices: {product: \"NVIDIA H100*\"}, exclusive: true}\n  - {devices: {product: \"*HBM3\"}, exclusive: true}\n",
        Some(2),
        None,
        "both match product \"NVIDIA H100 80GB HBM3\"",
    );
}

#[test]
fn two_modes_in_one_rule() {
    assert_one_error(
        "version: v1\nrules: [{devices: all, timeSlicing: {replicas: 2}, mps: {replicas: 2}}]\n",
        Some(1),
        None,
        "the rule sets timeSlicing and mps; a rule gives exactly one mode",
    );
}

#[test]
fn no_mode() {
    assert_one_error(
        "version: v1\nrules: [{devices: all}]\n",
        Some(1),
        None,
        "the rule gives no mode",
    );
}

#[test]
fn no_rules() {
    assert_one_error(
        "version: v1\nrules: []\n",
        None,
        None,
        "the profile has no rules",
    );
}

#[test]
fn unsupported_version() {
    assert_one_error(
        "version: v2\nrules: [{devices: all, exclusive: true}]\n",
        None,
        None,
        "version \"v2\" is not supported: this gpu-share reads version v1",
    );
}

#[test]
fn duplicate_and_empty_device_lists() {
    assert_one_error(
        "version: v1\nrules: [{devices: [1, \"0-2\"], exclusive: true}]\n",
        Some(1),
        None,
        "devices lists GPU 1 more than once",
    );
    assert_one_error(
        "version: v1\nrules: [{devices: [], exclusive: true}]\n",
        Some(1),
        None,
        "devices is an empty list",
    );
}

#[test]
fn zero_mig_count() {
    assert_one_error(
        "version: v1\nrules: [{devices: all, mig: {1g.10gb: 0}}]\n",
        Some(1),
        None,
        "mig asks for 0 × 1g.10gb: a count must be at least 1",
    );
}

#[test]
fn single_strategy_with_two_profiles() {
    assert_one_error(
        "version: v1\nplugin: {migStrategy: single}\nrules: [{devices: all, mig: {1g.10gb: 3, 2g.20gb: 2}}]\n",
        None,
        None,
        "more than one MIG device type present on node",
    );
}

#[test]
fn none_strategy_with_mig() {
    assert_one_error(
        "version: v1\nplugin: {migStrategy: none}\nrules: [{devices: all, mig: {1g.10gb: 7}}]\n",
        None,
        None,
        "plugin.migStrategy none advertises MIG-enabled GPUs as whole nvidia.com/gpu",
    );
}

#[test]
fn bad_config_map_key() {
    let text = "kind: ConfigMap\ndata:\n  Bad Key: |\n    version: v1\n    rules: [{devices: all, exclusive: true}]\n";
    let all = read_profiles("cm", text);
    let err = all[0].profile.as_ref().unwrap_err();
    assert!(
        err.message.contains("cannot be a node label value"),
        "{err}"
    );
}

/// What the stock NVIDIA device plugin (v0.20) cannot express is refused at validate time with
/// its reason (nvidia-stack.md §1.2, §1.4).
mod nvidia_plugin_limits {
    use super::*;

    #[test]
    fn mps_beside_mig() {
        assert_one_error(
            "version: v1\nrules:\n  - {devices: [0], mig: {1g.10gb: 7}}\n  - {devices: [1], mps: {replicas: 4}}\n",
            Some(2),
            None,
            "\"sharing using MPS is not supported for MIG devices\"",
        );
    }

    #[test]
    fn whole_gpus_shared_differently() {
        assert_one_error(
            "version: v1\nrules:\n  - {devices: [0, 1], timeSlicing: {replicas: 4}}\n  - {devices: [2, 3], timeSlicing: {replicas: 2}}\n",
            Some(2),
            None,
            "the NVIDIA device plugin shares every whole GPU on a node the same way (it ignores per-resource `devices`, k8s-device-plugin v0.20), but this rule gives whole GPUs timeSlicing and rule 1 gives them timeSlicing",
        );
        assert_one_error(
            "version: v1\nrules:\n  - {devices: [0], exclusive: true}\n  - {devices: [1], mps: {replicas: 4}}\n",
            Some(2),
            None,
            "this rule gives whole GPUs mps and rule 1 gives them exclusive",
        );
    }

    #[test]
    fn one_mig_profile_with_two_replica_counts() {
        assert_one_error(
            "version: v1\nrules:\n  - {devices: [0], mig: {1g.10gb: 7}, timeSlicing: {replicas: 2}}\n  - {devices: [1], mig: {1g.10gb: 7}}\n",
            Some(2),
            None,
            "1g.10gb devices are shared × 1 here but × 2 by rule 1: the NVIDIA device plugin takes one replica count per resource",
        );
    }
}

/// Problems only a concrete node can show are reported by `plan`, which changes nothing.
mod on_a_node {
    use super::*;

    fn plan_errors(text: &str, gpus: &[&str]) -> Vec<String> {
        let profile = read_profiles("bad", text).remove(0).profile.unwrap();
        let node = ObservedNode::simulated(&gpus.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        plan("bad", &profile, &node)
            .expect_err("plan must refuse")
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn mig_on_a_gpu_without_mig() {
        let errors = plan_errors(
            "version: v1\nrules: [{devices: all, mig: {1g.10gb: 7}}]\n",
            &["NVIDIA GeForce RTX 4090"],
        );
        assert_eq!(
            errors,
            ["error: profile \"bad\", rule 1 (devices all), GPU 0 (NVIDIA GeForce RTX 4090): the rule asks for MIG instances, but \"NVIDIA GeForce RTX 4090\" is not in the MIG catalog, so it is taken as a GPU without MIG (`gpu-share catalog` lists the MIG-capable models)"]
        );
    }

    #[test]
    fn mig_on_a_catalog_gpu_whose_nvml_reports_no_mig_mode() {
        let profile = read_profiles(
            "bad",
            "version: v1\nrules: [{devices: all, mig: {1g.10gb: 7}}]\n",
        )
        .remove(0)
        .profile
        .unwrap();
        let mut node = ObservedNode::simulated(&["h100".into()]);
        node.gpus[0].mig = None;
        let errors: Vec<String> = plan("bad", &profile, &node)
            .expect_err("plan must refuse")
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            errors,
            ["error: profile \"bad\", rule 1 (devices all), GPU 0 (NVIDIA H100 80GB HBM3): this GPU cannot run MIG (NVML reports no MIG mode), but the rule asks for MIG instances"]
        );
    }

    #[test]
    fn a_geometry_the_nodes_model_cannot_hold() {
        // Valid on an H100 (where 1g.10gb is a 1-slot profile), impossible on an A100 40GB.
        let errors = plan_errors(
            "version: v1\nrules: [{devices: all, mig: {1g.10gb: 7}}]\n",
            &["a100-40gb"],
        );
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].contains("GPU 0 (NVIDIA A100-SXM4-40GB): 7 × 1g.10gb asked, but at most 4"),
            "{}",
            errors[0]
        );
    }

    #[test]
    fn a_time_sliced_rule_beside_gpus_no_rule_selects() {
        // GPU 1 stays exclusive, but the NVIDIA plugin would time-slice it too.
        let errors = plan_errors(
            "version: v1\nrules: [{devices: [0], timeSlicing: {replicas: 4}}]\n",
            &["h100x2"],
        );
        assert_eq!(
            errors,
            ["error: profile \"bad\": the NVIDIA device plugin shares every whole GPU on a node the same way (it ignores per-resource `devices`, k8s-device-plugin v0.20), but GPU 0 is time-sliced × 4 and GPU 1 is exclusive: give every whole GPU one mode"]
        );
    }

    #[test]
    fn index_and_product_selectors_that_meet_on_one_gpu() {
        let errors = plan_errors(
            "version: v1\nrules:\n  - {devices: [0], exclusive: true}\n  - {devices: {product: \"NVIDIA H100*\"}, exclusive: true}\n",
            &["h100x2"],
        );
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].contains("GPU 0 (NVIDIA H100 80GB HBM3) is selected by rule 1 and rule 2"),
            "{}",
            errors[0]
        );
    }
}

/// Every count has an upper bound; the message names the field, the value
/// and the range. The bounds and their reasons are documented in `src/profile/format.rs`.
mod bounds {
    use super::*;

    #[test]
    fn a_billion_time_slicing_replicas() {
        assert_one_error(
            "version: v1\nrules: [{devices: all, timeSlicing: {replicas: 1000000000}}]\n",
            Some(1),
            None,
            "timeSlicing.replicas is 1000000000, but it must be between 2 and 1024",
        );
    }

    #[test]
    fn time_slicing_replicas_at_the_cap_are_accepted() {
        let text = "version: v1\nrules: [{devices: all, timeSlicing: {replicas: 1024}}]\n";
        assert!(problems(text).is_empty(), "{:#?}", problems(text));
    }

    #[test]
    fn mig_devices_time_sliced_too_often() {
        assert_one_error(
            "version: v1\nrules: [{devices: all, mig: {1g.10gb: 7}, timeSlicing: {replicas: 5000}}]\n",
            Some(1),
            None,
            "timeSlicing.replicas is 5000, but it must be between 2 and 1024",
        );
    }

    #[test]
    fn replicas_too_large_for_any_integer_name_the_field_and_range() {
        // Over 64 bits: before, `serde_yaml::Value` refused it ("not valid YAML … expected any
        // YAML value") without saying which field.
        assert_one_error(
            "version: v1\nrules: [{devices: all, timeSlicing: {replicas: 99999999999999999999}}]\n",
            None,
            None,
            "timeSlicing.replicas is 99999999999999999999, but it must be between 2 and 1024",
        );
        assert_one_error(
            "version: v1\nrules: [{devices: all, mps: {replicas: 18446744073709551615}}]\n",
            None,
            None,
            "mps.replicas is 18446744073709551615, but it must be between 2 and 48",
        );
    }

    #[test]
    fn mig_count_too_large_for_any_integer() {
        // Counts that fit an i64 meet the catalog ("at most 7 instances of 1g.10gb"); one over
        // 64 bits is named with its range before any catalog lookup.
        assert_one_error(
            "version: v1\nrules: [{devices: all, mig: {1g.10gb: 99999999999999999999}}]\n",
            None,
            None,
            "rules[0].mig.1g.10gb: the MIG count is 99999999999999999999, but it must be between 1 and 7",
        );
    }

    #[test]
    fn gpu_index_beyond_any_node() {
        assert_one_error(
            "version: v1\nrules: [{devices: [0, 99999], exclusive: true}]\n",
            Some(1),
            None,
            "devices lists GPU 99999, but GPU indices run from 0 to 63",
        );
        let text = "version: v1\nrules: [{devices: [63], exclusive: true}]\n";
        assert!(problems(text).is_empty(), "{:#?}", problems(text));
    }

    fn exclusive_rules(n: usize) -> String {
        let mut text = String::from("version: v1\nrules:\n");
        for i in 0..n {
            text.push_str(&format!(
                "  - {{devices: {{product: \"GPU model {i}\"}}, exclusive: true}}\n"
            ));
        }
        text
    }

    #[test]
    fn more_rules_than_the_cap() {
        assert_one_error(
            &exclusive_rules(1025),
            None,
            None,
            "the profile has 1025 rules, but at most 1024 are allowed",
        );
        let at_cap = exclusive_rules(1024);
        assert!(problems(&at_cap).iter().all(|p| !p.is_error()));
    }

    #[test]
    fn a_profile_larger_than_a_config_map_is_refused_unparsed() {
        // 1 MiB + 1 byte of a YAML comment: refused on its length alone.
        let mut text = "version: v1\nrules: [{devices: all, exclusive: true}]\n#".to_string();
        text.push_str(&"x".repeat(gpu_share::profile::MAX_PROFILE_BYTES + 1 - text.len()));
        assert_one_error(
            &text,
            None,
            None,
            "is larger than 1048576 bytes (1 MiB), the most gpu-share reads",
        );
        let err = gpu_share::profile::parse_profile("key", &text).unwrap_err();
        assert!(
            err.message
                .contains("the profile is larger than 1048576 bytes"),
            "{err}"
        );
    }
}

/// Overlap checks compare each rule with what earlier rules claimed, once.
mod overlaps {
    use super::*;

    #[test]
    fn each_overlapping_rule_is_reported_once_against_the_first_rule_it_meets() {
        let errors: Vec<String> = problems(
            "version: v1\nrules:\n  - {devices: [0, 1], exclusive: true}\n  - {devices: [1, 2], exclusive: true}\n  - {devices: [2, 1, 0], exclusive: true}\n",
        )
.iter()
.map(ToString::to_string)
.collect();
        assert_eq!(errors.len(), 2, "{errors:#?}");
        assert!(
            errors[0].contains(
                "rule 2 (devices [1, 2]): its devices overlap rule 1's: both select GPU 1"
            ),
            "{}",
            errors[0]
        );
        assert!(
            errors[1].contains(
                "rule 3 (devices [2, 1, 0]): its devices overlap rule 1's: both select GPU 0, 1"
            ),
            "{}",
            errors[1]
        );
    }

    #[test]
    fn equal_product_patterns_outside_the_catalog_overlap() {
        assert_one_error(
            "version: v1\nrules:\n  - {devices: {product: \"NVIDIA RTX 9999\"}, exclusive: true}\n  - {devices: {product: \"nvidia rtx 9999\"}, exclusive: true}\n",
            Some(2),
            None,
            "both match product \"nvidia rtx 9999\"",
        );
    }

    #[test]
    fn a_rule_after_all_overlaps_it() {
        assert_one_error(
            "version: v1\nrules:\n  - {devices: [0], exclusive: true}\n  - {devices: all, exclusive: true}\n",
            Some(2),
            None,
            "its devices overlap rule 1's: `all` selects every GPU",
        );
    }
}

/// MPS settings a GPU cannot honour.
mod mps_on_the_gpu {
    use super::*;

    fn plan_problems(text: &str, gpus: &[&str]) -> Result<Vec<String>, Vec<String>> {
        let profile = read_profiles("bad", text).remove(0).profile.unwrap();
        let node = ObservedNode::simulated(&gpus.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let show = |ps: Vec<Problem>| ps.iter().map(ToString::to_string).collect::<Vec<_>>();
        plan("bad", &profile, &node)
            .map(|p| show(p.warnings))
            .map_err(show)
    }

    #[test]
    fn pinned_memory_above_the_gpus_memory_warns_on_each_gpu() {
        let warnings = plan_problems(
            "version: v1\nrules: [{devices: all, mps: {replicas: 4, pinnedMemoryLimit: 500Gi}}]\n",
            &["h100x2"],
        )
        .expect("a warning, not an error");
        let over: Vec<&String> = warnings
            .iter()
            .filter(|w| w.contains("limits nothing"))
            .collect();
        assert_eq!(over.len(), 3, "{warnings:#?}");
        assert!(over.iter().any(|w| w.contains("GPU 1 (NVIDIA H100 80GB HBM3): mps.pinnedMemoryLimit gives each client 512000 MiB, but this GPU has 81559 MiB")), "{over:#?}");
    }

    #[test]
    fn pinned_memory_above_every_known_gpu_warns_in_validate() {
        let found = problems(
            "version: v1\nrules: [{devices: all, mps: {replicas: 4, pinnedMemoryLimit: 500Gi}}]\n",
        );
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(found[0].severity, Severity::Warning);
        assert!(
            found[0]
                .message
                .contains("more than any GPU this rule can select has"),
            "{}",
            found[0]
        );
        let fits = problems(
            "version: v1\nrules: [{devices: all, mps: {replicas: 4, pinnedMemoryLimit: 16Gi}}]\n",
        );
        assert!(fits.is_empty(), "{fits:#?}");
    }

    #[test]
    fn mps_on_a_jetson_says_mps_is_not_available() {
        let errors = plan_problems(
            "version: v1\nrules: [{devices: all, mps: {replicas: 4, pinnedMemoryLimit: auto}}]\n",
            &["NVIDIA Jetson AGX Orin Developer Kit"],
        )
        .expect_err("MPS refused");
        assert_eq!(errors.len(), 1, "{errors:#?}");
        assert!(
            errors[0].contains("MPS is not available on NVIDIA Jetson AGX Orin Developer Kit"),
            "{}",
            errors[0]
        );
        assert!(
            !errors[0].contains("memory size is unknown"),
            "{}",
            errors[0]
        );
        assert_one_error(
            "version: v1\nrules: [{devices: {product: \"*Orin*\"}, mps: {replicas: 2}}]\n",
            Some(1),
            None,
            "MPS is not available on *Orin*",
        );
    }
}
