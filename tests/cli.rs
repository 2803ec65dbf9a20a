//! The `gpu-share` binary as a user runs it: validate, plan, schema, catalog.

use std::path::Path;
use std::process::{Command, Output};

fn gpu_share(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-share"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run gpu-share")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

/// Every example profile and the simulated node it is written for.
const EXAMPLES: &[(&str, &str)] = &[
    ("profiles/h100-inference.yaml", "h100x8"),
    ("profiles/h100-balanced.yaml", "h100x8"),
    ("profiles/a100-40gb-mixed.yaml", "a100-40gbx8"),
    ("profiles/a100-80gb-single.yaml", "a100-80gbx4"),
    ("profiles/h200-mig-timeslice.yaml", "h200x8"),
    ("profiles/h100-mps.yaml", "h100x4"),
    (
        "profiles/homelab-timeslice.yaml",
        "NVIDIA GeForce RTX 3090x2",
    ),
    ("profiles/exclusive.yaml", "h100x2"),
    ("profiles/homelab-mixed.yaml", "NVIDIA GeForce RTX 3090"),
];

#[test]
fn every_example_profile_is_listed_here_and_validates() {
    // Files only: profiles/builtin/ holds examples for `--plugin builtin` (tests/builtin_plugin.rs).
    let mut on_disk: Vec<String> = std::fs::read_dir("profiles")
        .unwrap()
        .filter(|e| e.as_ref().is_ok_and(|e| e.path().is_file()))
        .map(|e| format!("profiles/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = EXAMPLES.iter().map(|(p, _)| p.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "add new example profiles to EXAMPLES");
    for (file, _) in EXAMPLES {
        let out = gpu_share(&["validate", file]);
        assert!(out.status.success(), "{file}: {}", stdout(&out));
        assert!(stdout(&out).contains("1 profile checked: 1 valid, 0 with errors"));
    }
}

#[test]
fn every_example_profile_plans_on_its_node() {
    for (file, gpus) in EXAMPLES {
        let out = gpu_share(&["plan", "--profile", file, "--gpu", gpus, "-o", "json"]);
        assert!(out.status.success(), "{file}: {}", stdout(&out));
        let plan = json(&out);
        assert!(!plan["resources"].as_object().unwrap().is_empty(), "{file}");
    }
}

#[test]
fn quick_start_plan_on_a_simulated_h100() {
    let out = gpu_share(&[
        "plan",
        "--profile",
        "profiles/h100-inference.yaml",
        "--gpu",
        "h100x8",
    ]);
    assert!(out.status.success());
    let text = stdout(&out);
    assert!(
        text.contains("GPU 0  NVIDIA H100 80GB HBM3  (rule 1 \"partitioned\": MIG 7 × 1g.10gb)")
    );
    assert!(text.contains("  enable MIG mode\n  create  1g.10gb    at 0:1\n"));
    assert!(
        text.contains("  nvidia.com/gpu          16\n  nvidia.com/mig-1g.10gb  28\n"),
        "{text}"
    );
}

#[test]
fn replicas_multiply_the_advertised_gpus() {
    // 4 GPUs × 4 replicas, renamed because the profile sets renameByDefault.
    let out = gpu_share(&[
        "plan",
        "--profile",
        "profiles/homelab-timeslice.yaml",
        "--gpu",
        "NVIDIA GeForce RTX 3090x4",
        "-o",
        "json",
    ]);
    let plan = json(&out);
    assert_eq!(
        plan["resources"],
        serde_json::json!({"nvidia.com/gpu.shared": 16})
    );
    assert_eq!(plan["migStrategy"], "none");
}

#[test]
fn single_strategy_advertises_mig_devices_as_gpus() {
    let out = gpu_share(&[
        "plan",
        "--profile",
        "profiles/a100-80gb-single.yaml",
        "--gpu",
        "a100-80gbx2",
        "-o",
        "yaml",
    ]);
    let plan: serde_json::Value = serde_yaml::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["migStrategy"], "single");
    assert_eq!(plan["resources"], serde_json::json!({"nvidia.com/gpu": 14}));
}

#[test]
fn plan_against_an_observed_state_keeps_instances_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let current = dir.path().join("node.yaml");
    std::fs::write(
        &current,
        "gpus:\n  - index: 0\n    product: NVIDIA H100 80GB HBM3\n    memoryMib: 81559\n    mig: {current: true, pending: true}\n    instances:\n      - {profile: 1g.10gb, placement: [0, 1], giId: 7}\n      - {profile: 1g.10gb, placement: [1, 1], giId: 8}\n      - {profile: 2g.20gb, placement: [2, 2], giId: 4}\n",
    )
.unwrap();
    let profile = dir.path().join("p.yaml");
    std::fs::write(
        &profile,
        "version: v1\nrules: [{devices: all, mig: {3g.40gb: 1, 1g.10gb: 2}}]\n",
    )
    .unwrap();
    let out = gpu_share(&[
        "plan",
        "--profile",
        path(&profile),
        "--current",
        path(&current),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = stdout(&out);
    assert!(text.contains("  destroy 2g.20gb    at 2:2 (GI 4)\n  keep    1g.10gb    at 0:1 (GI 7)\n  keep    1g.10gb    at 1:1 (GI 8)\n  create  3g.40gb    at 4:4\n"), "{text}");
    assert!(
        !text.contains("enable MIG mode"),
        "MIG is already on: {text}"
    );
}

#[test]
fn validate_reads_config_maps_and_fails_on_any_bad_key() {
    let dir = tempfile::tempdir().unwrap();
    let cm = dir.path().join("profiles-cm.yaml");
    std::fs::write(
        &cm,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: gpu-share-profiles}\ndata:\n  small: |\n    version: v1\n    rules: [{devices: all, timeSlicing: {replicas: 4}}]\n  broken: |\n    version: v1\n    rules: [{devices: all, timeSlicing: {replicas: 0}}]\n",
    )
.unwrap();
    let out = gpu_share(&["validate", path(&cm)]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(text.contains("ok: profile \"small\""), "{text}");
    assert!(
        text.contains("error: profile \"broken\", rule 1 (devices all): timeSlicing.replicas is 0"),
        "{text}"
    );
    assert!(text.contains("2 profiles checked: 1 valid, 1 with errors"));

    let out = gpu_share(&["validate", path(&cm), "-o", "json"]);
    let results = json(&out);
    assert_eq!(results[0]["profile"], "broken");
    assert_eq!(results[0]["valid"], false);
    assert_eq!(results[0]["problems"][0]["rule"]["number"], 1);

    let out = gpu_share(&["plan", "--profile", path(&cm), "--gpu", "h100"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("holds 2 profiles (broken, small): pick one with --key"));
    let out = gpu_share(&[
        "plan",
        "--profile",
        path(&cm),
        "--key",
        "small",
        "--gpu",
        "h100",
    ]);
    assert!(out.status.success());
}

#[test]
fn plan_refuses_an_invalid_profile_with_exit_code_1() {
    let out = gpu_share(&[
        "plan",
        "--profile",
        "tests/data/impossible.yaml",
        "--gpu",
        "a100-40gb",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("too many compute slices: the instances need 8, the GPU has 7"));
}

#[test]
fn schema_is_json_schema_that_forbids_unknown_fields() {
    let out = gpu_share(&["schema"]);
    let schema = json(&out);
    assert_eq!(schema["title"], "Profile");
    assert_eq!(schema["additionalProperties"], false);
    assert!(schema["properties"]["rules"].is_object());
    assert_eq!(schema["required"], serde_json::json!(["version", "rules"]));
    let rule = &schema["$defs"]["Rule"]["properties"];
    assert!(
        rule["dynamicMig"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("--plugin dra")),
        "{rule}"
    );
}

#[test]
fn catalog_lists_every_model() {
    let out = gpu_share(&["catalog", "-o", "json"]);
    let models = json(&out);
    let names: Vec<&str> = models
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["nvml_name"].as_str().unwrap())
        .collect();
    for wanted in [
        "NVIDIA A100-SXM4-40GB",
        "NVIDIA A30",
        "NVIDIA H100 NVL",
        "NVIDIA H200",
        "NVIDIA B200",
    ] {
        assert!(names.contains(&wanted), "{wanted} missing from {names:?}");
    }
    let text = stdout(&gpu_share(&["catalog"]));
    assert!(
        text.contains("    3g.20gb          id  9  max 2   20096 MiB  starts {0,4}:4\n"),
        "{text}"
    );
}

/// Every source `catalog` prints is a document a user can open (a URL or a
/// pinned repository file), never an id of a private search index; item 12: the compute-instance
/// profiles of each GI profile are shown, the unverified ones marked.
#[test]
fn catalog_shows_openable_sources_and_marks_unverified_compute_instances() {
    let text = stdout(&gpu_share(&["catalog"]));
    let sources: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("source: "))
        .collect();
    let models = gpu_share::mig::catalog::catalog().models.len();
    assert!(sources.len() >= models, "{text}");
    for s in &sources {
        assert!(
            gpu_share::mig::catalog::is_public_reference(s),
            "unopenable source {s:?}"
        );
    }
    for private in ["find_string", "search id"] {
        assert!(!text.contains(private), "{text}");
    }
    assert!(
        text.contains("    source: https://github.com/NVIDIA/mig-parted/issues/120\n"),
        "{text}"
    );
    // H100 1g.20gb: 1_SLICE (0) offered but unverified, 1_SLICE_REV1 (7) the default.
    let h100 = &text[text.find("h100-80gb-sxm ").unwrap()..];
    let after_1g20 = &h100[h100.find("    1g.20gb ").unwrap()..];
    let ci_line = after_1g20.lines().nth(1).unwrap();
    assert_eq!(ci_line, "      compute instances: 0:1cx1? 7:1cx1*");

    let json = json(&gpu_share(&["catalog", "-o", "json"]));
    for m in json.as_array().unwrap() {
        for s in m["sources"].as_array().unwrap() {
            assert!(gpu_share::mig::catalog::is_public_reference(
                s.as_str().unwrap()
            ));
        }
    }
}

/// A real H200 (NVML 580.159.04, MIG off) reported these memorySizeMB through
/// `nvmlDeviceGetGpuInstanceProfileInfo` (docs/measured/h200-nvml.md); `catalog` must print
/// them, say they were read through NVML, and say the figures of other models are derived.
#[test]
fn catalog_has_the_real_h200_memory_and_says_what_each_figure_rests_on() {
    let json = json(&gpu_share(&["catalog", "-o", "json"]));
    let h200 = json
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["nvml_name"] == "NVIDIA H200")
        .expect("H200 in the catalog");
    let memory: Vec<(&str, u64)> = h200["gpu_instance_profiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap(),
                p["memory_mib"].as_u64().unwrap(),
            )
        })
        .collect();
    // The figures themselves are pinned to the measurement by the catalog's unit test
    // (the_h200_is_the_one_measured_through_nvml); here: `catalog` prints them.
    let library = gpu_share::mig::catalog::catalog()
        .model("NVIDIA H200")
        .unwrap();
    let expected: Vec<(&str, u64)> = library
        .gpu_instance_profiles
        .iter()
        .map(|p| (p.name.as_str(), p.memory_mib.unwrap()))
        .collect();
    assert_eq!(memory, expected);
    assert!(memory.contains(&("7g.141gb", 143360)), "{memory:?}");
    let text = stdout(&gpu_share(&["catalog"]));
    let h200 = &text[text.find("h200-141gb  ").unwrap()..];
    let h200 = &h200[..h200.find("\n    basis:").unwrap()];
    assert!(!h200.contains("[placements inferred]"), "{h200}");
    assert!(
        h200.ends_with("    memory: read through NVML on a real GPU (exact)"),
        "{h200}"
    );
    let h100 = &text[text.find("h100-80gb-sxm  ").unwrap()..];
    assert!(
        h100.contains("    memory: derived from nvidia-smi's printed GiB"),
        "{h100}"
    );
    let b200 = &text[text.find("b200-180gb  ").unwrap()..];
    assert!(
        b200.contains("a third party's measurement for 3g.90gb, 4g.90gb, 7g.180gb"),
        "{b200}"
    );
    assert!(
        text.contains("    source: docs/measured/h200-nvml.md\n"),
        "{text}"
    );
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Resource name → device count.
type Advertised = &'static [(&'static str, u64)];

/// The examples under profiles/builtin/, for `--plugin builtin`: the node each is written for
/// and the resources it advertises there.
const BUILTIN_EXAMPLES: &[(&str, &str, Advertised)] = &[
    (
        "profiles/builtin/h100-mixed-sharing.yaml",
        "h100x6",
        // 2 time-sliced × 4 + 2 MPS × 8; 2 GPUs × 7 MIG devices.
        &[("nvidia.com/gpu", 24), ("nvidia.com/mig-1g.10gb", 14)],
    ),
    (
        "profiles/builtin/h100-mps-in-mig.yaml",
        "h100x2",
        // 2 GPUs × 2 MIG devices × 4 MPS clients.
        &[("nvidia.com/mig-3g.40gb", 16)],
    ),
];

#[test]
fn builtin_examples_validate_for_the_builtin_plugin_only_and_plan() {
    let mut on_disk: Vec<String> = std::fs::read_dir("profiles/builtin")
        .unwrap()
        .map(|e| {
            format!(
                "profiles/builtin/{}",
                e.unwrap().file_name().to_string_lossy()
            )
        })
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = BUILTIN_EXAMPLES
        .iter()
        .map(|(p, _, _)| p.to_string())
        .collect();
    listed.sort();
    assert_eq!(
        on_disk, listed,
        "add new builtin examples to BUILTIN_EXAMPLES"
    );
    for (file, gpus, resources) in BUILTIN_EXAMPLES {
        let nvidia = gpu_share(&["validate", file]);
        assert_eq!(nvidia.status.code(), Some(1), "{file}: {}", stdout(&nvidia));
        assert!(
            stdout(&nvidia).contains("--plugin builtin"),
            "{}",
            stdout(&nvidia)
        );
        let builtin = gpu_share(&["validate", "--plugin", "builtin", file]);
        assert!(builtin.status.success(), "{file}: {}", stdout(&builtin));
        let plan = gpu_share(&[
            "plan",
            "--plugin",
            "builtin",
            "--profile",
            file,
            "--gpu",
            gpus,
            "-o",
            "json",
        ]);
        assert!(plan.status.success(), "{file}: {}", stdout(&plan));
        let plan = json(&plan);
        let advertised: Vec<(String, u64)> = plan["resources"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
            .collect();
        let expected: Vec<(String, u64)> =
            resources.iter().map(|(r, n)| (r.to_string(), *n)).collect();
        assert_eq!(advertised, expected, "{file}");
        assert!(
            plan.get("devicePluginConfig").is_none(),
            "{file}: no NVIDIA config for builtin"
        );
    }
}

/// `file` is refused by `validate` for both device plugins with `why`, and valid for DRA.
fn valid_for_dra_only(file: &str, why: &str) {
    for plugin in ["nvidia", "builtin"] {
        let out = gpu_share(&["validate", "--plugin", plugin, file]);
        assert_eq!(out.status.code(), Some(1), "{plugin}: {}", stdout(&out));
        assert!(stdout(&out).contains(why), "{}", stdout(&out));
    }
    let dra = gpu_share(&["validate", "--plugin", "dra", file]);
    assert!(dra.status.success(), "{}", stdout(&dra));
}

/// The examples under profiles/dra/ (`dynamicMig`, DRA only): refused for both device plugins
/// with a message naming `--plugin dra`, valid for DRA, and planned on the node each is written
/// for with its dynamic GPUs left alone and their placements in the slices.
#[test]
fn dra_examples_validate_for_dra_only_and_plan_dynamic_gpus() {
    let mut on_disk: Vec<String> = std::fs::read_dir("profiles/dra")
        .unwrap()
        .map(|e| format!("profiles/dra/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    on_disk.sort();
    assert_eq!(
        on_disk,
        [
            "profiles/dra/h100-fractional.yaml",
            "profiles/dra/h200-dynamic-mig.yaml"
        ],
        "list new DRA examples here"
    );
    let file = "profiles/dra/h200-dynamic-mig.yaml";
    valid_for_dra_only(file, "dynamicMig needs `--plugin dra`");
    let plan = gpu_share(&[
        "plan",
        "--plugin",
        "dra",
        "--profile",
        file,
        "--gpu",
        "h200x8",
        "-o",
        "json",
    ]);
    assert!(plan.status.success(), "{}", stdout(&plan));
    let plan = json(&plan);
    let gpus = plan["gpus"].as_array().unwrap();
    let dynamic = gpus
        .iter()
        .filter(|g| g["mode"]["type"] == "dynamicMig")
        .count();
    assert_eq!(dynamic, 6);
    assert!(gpus
        .iter()
        .all(|g| g.get("geometry").is_none() && g.get("migMode").is_none()));
    let devices: Vec<String> = plan["resourceSlices"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect();
    assert!(
        devices.iter().any(|d| d == "gpu-5-mig-0-7g-141gb"),
        "{devices:?}"
    );
    assert!(
        !devices.iter().any(|d| d.starts_with("gpu-6-mig")),
        "{devices:?}"
    );
}

#[test]
fn mps_inside_mig_devices_is_planned_per_device_with_its_client_limit() {
    let plan = gpu_share(&[
        "plan",
        "--plugin",
        "builtin",
        "--profile",
        "profiles/builtin/h100-mps-in-mig.yaml",
        "--gpu",
        "h100x2",
        "-o",
        "json",
    ]);
    let plan = json(&plan);
    // 2 GPUs × 2 instances × 4 clients.
    assert_eq!(plan["resources"]["nvidia.com/mig-3g.40gb"], 16);
    let mode = &plan["gpus"][0]["mode"];
    assert_eq!(mode["type"], "mig");
    assert_eq!(mode["replicas"], 4);
    assert_eq!(mode["mps"]["activeThreadPercentage"], 50);
    // auto: the 3g.40gb profile's memory (catalog: 40448 MiB on H100 SXM) over 4 clients.
    assert_eq!(mode["mps"]["pinnedMemoryLimitMib"]["3g.40gb"], 40448 / 4);

    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_string_lossy().into_owned()
    };
    // MIG User Guide: the 48 clients are lowered in proportion to the compute instance: a
    // 1g.10gb is 1 of 7 slices, so 48 × 1/7 → 6.
    let seven = write(
        "seven.yaml",
        "version: v1\nrules:\n  - devices: all\n    mig: {1g.10gb: 7}\n    mps: {replicas: 7}\n",
    );
    let out = gpu_share(&["validate", "--plugin", "builtin", &seven]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains(
            "takes at most 6 clients (48 lowered in proportion to its 1 of 7 compute slices"
        ),
        "{}",
        stdout(&out)
    );
    let six = write(
        "six.yaml",
        "version: v1\nrules:\n  - devices: all\n    mig: {1g.10gb: 7}\n    mps: {replicas: 6}\n",
    );
    let out = gpu_share(&["validate", "--plugin", "builtin", &six]);
    assert!(out.status.success(), "{}", stdout(&out));
    let both = write(
        "both.yaml",
        "version: v1\nrules:\n  - devices: all\n    mig: {1g.10gb: 7}\n    mps: {replicas: 2}\n    timeSlicing: {replicas: 2}\n",
    );
    let out = gpu_share(&["validate", "--plugin", "builtin", &both]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("the rule sets timeSlicing and mps and mig"),
        "{}",
        stdout(&out)
    );
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `--gpu` specs that used to plan a node other than the one meant.
#[test]
fn plan_refuses_gpu_specs_that_would_mislead() {
    let plan_on = |gpu: &str| {
        gpu_share(&[
            "plan",
            "--profile",
            "profiles/h100-inference.yaml",
            "--gpu",
            gpu,
        ])
    };
    for (gpu, says) in [
        (
            "h10x8",
            "\"h10\" is not in the MIG catalog; did you mean `h100` or `h20`?",
        ),
        (
            "h100x17",
            "17 GPUs of h100; a simulated node holds 1 to 16 (MAX_SIMULATED_GPUS)",
        ),
        ("", "no GPU model"),
    ] {
        let out = plan_on(gpu);
        assert_eq!(
            out.status.code(),
            Some(2),
            "--gpu {gpu:?}: {}",
            stderr(&out)
        );
        assert!(
            stderr(&out).contains(says),
            "--gpu {gpu:?}: {}",
            stderr(&out)
        );
        assert!(out.stdout.is_empty(), "--gpu {gpu:?}: no plan printed");
    }
}

#[test]
fn a_mig_profile_on_a_name_outside_the_catalog_says_so() {
    let out = gpu_share(&[
        "plan",
        "--profile",
        "profiles/h100-inference.yaml",
        "--gpu",
        "NVIDIA H10x2",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains(
            "\"NVIDIA H10\" is not in the MIG catalog, so it is taken as a GPU without MIG"
        ),
        "{}",
        stdout(&out)
    );
}

#[test]
fn plan_help_says_how_names_outside_the_catalog_are_taken() {
    let help = stdout(&gpu_share(&["plan", "--help"]));
    for says in [
        "N from 1 to 16",
        "A name not in the catalog is taken as a GPU without MIG",
        "a typo away from a catalog model",
    ] {
        assert!(help.contains(says), "{says:?} missing from:\n{help}");
    }
}

/// H100-inference's rules name GPUs 0-3 and 4-7; on a 2-GPU node the
/// missing ones were dropped without a word.
#[test]
fn plan_warns_about_rules_naming_gpus_the_node_lacks() {
    let first = "warning: profile \"h100-inference\", rule 1 \"partitioned\" (devices [0, 1, 2, 3]): selects GPU 2-3, which this node does not have (it has GPU 0-1): nothing is planned for them";
    let second = "warning: profile \"h100-inference\", rule 2 \"time-sliced\" (devices [4, 5, 6, 7]): selects GPU 4-7, which this node does not have (it has GPU 0-1): nothing is planned for them";
    let simulated = [
        "plan",
        "--profile",
        "profiles/h100-inference.yaml",
        "--gpu",
        "h100x2",
    ];
    let out = gpu_share(&simulated);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains(first) && text.contains(second), "{text}");

    // The same node observed (`plan --current`), in JSON: the warnings name rule and indices.
    let dir = tempfile::tempdir().unwrap();
    let current = dir.path().join("node.yaml");
    std::fs::write(
        &current,
        "gpus:\n  - {index: 0, product: NVIDIA H100 80GB HBM3, memoryMib: 81559, mig: {current: false, pending: false}}\n  - {index: 1, product: NVIDIA H100 80GB HBM3, memoryMib: 81559, mig: {current: false, pending: false}}\n",
    )
.unwrap();
    let out = gpu_share(&[
        "plan",
        "--profile",
        "profiles/h100-inference.yaml",
        "--current",
        path(&current),
        "-o",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let warnings = json(&out)["warnings"].clone();
    let about_rule = |n: u64| {
        warnings
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["rule"]["number"] == n)
            .unwrap_or_else(|| panic!("no warning for rule {n}: {warnings}"))
            .clone()
    };
    assert_eq!(about_rule(2)["severity"], "warning");
    assert_eq!(
        about_rule(2)["message"],
        "selects GPU 4-7, which this node does not have (it has GPU 0-1): nothing is planned for them"
    );
    assert!(about_rule(1)["message"]
        .as_str()
        .unwrap()
        .starts_with("selects GPU 2-3,"));

    // A node with every GPU the rules name: no such warning.
    let out = gpu_share(&[
        "plan",
        "--profile",
        "profiles/h100-inference.yaml",
        "--gpu",
        "h100x8",
    ]);
    assert!(!stdout(&out).contains("does not have"), "{}", stdout(&out));
}

/// Kube's config error quotes the file error and returns it as its source
/// too; printed as a chain, "No such file or directory" came out three times.
#[test]
fn the_agent_without_a_kubeconfig_names_the_missing_file_once() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-share"))
        .arg("agent")
        .env("NODE_NAME", "gpu-node-1")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .output()
        .expect("run gpu-share agent");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("/nonexistent/kubeconfig"), "{said}");
    assert_eq!(
        said.matches("No such file or directory").count(),
        1,
        "{said}"
    );
}

/// The schema states the ranges `validate` enforces, so editors flag them.
#[test]
fn schema_gives_every_count_its_range() {
    let schema = json(&gpu_share(&["schema"]));
    let defs = &schema["$defs"];
    let range = |v: &serde_json::Value| (v["minimum"].as_i64(), v["maximum"].as_i64());
    assert_eq!(schema["properties"]["rules"]["maxItems"], 1024);
    assert_eq!(
        range(&defs["TimeSlicing"]["properties"]["replicas"]),
        (Some(2), Some(1024))
    );
    assert_eq!(
        range(&defs["Mps"]["properties"]["replicas"]),
        (Some(2), Some(48))
    );
    assert_eq!(
        range(&defs["Mps"]["properties"]["activeThreadPercentage"]),
        (Some(1), Some(100))
    );
    assert_eq!(
        range(&defs["Rule"]["properties"]["mig"]["additionalProperties"]),
        (Some(1), Some(7))
    );
    let index = &defs["DeviceSelector"]["oneOf"][1]["items"]["oneOf"][0];
    assert_eq!(range(index), (Some(0), Some(63)));
}

/// A file over 1 MiB is refused after reading 1 MiB + 1 byte, not parsed.
#[test]
fn validate_refuses_a_file_over_1_mib() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.yaml");
    let mut text = std::fs::read_to_string("profiles/exclusive.yaml").unwrap();
    text.push('#');
    text.push_str(&"x".repeat(2 * 1024 * 1024));
    std::fs::write(&path, text).unwrap();
    let out = gpu_share(&["validate", path.to_str().unwrap(), "-o", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let results = json(&out);
    let text = results.to_string();
    assert!(
        text.contains("the file is larger than 1048576 bytes"),
        "{text}"
    );
    assert!(text.contains("\"huge\""), "{text}");
}

/// `plan --plugin dra` prints the ResourceSlices the node would publish, one DRA device per
/// unit `plan` advertises, for every example profile on its node and the `profiles/builtin/`
/// ones (which the NVIDIA plugin refuses) on 8 × H100.
#[test]
fn plan_for_dra_prints_one_device_per_advertised_resource_for_every_example_profile() {
    let builtin = [
        ("profiles/builtin/h100-mixed-sharing.yaml", "h100x8"),
        ("profiles/builtin/h100-mps-in-mig.yaml", "h100x8"),
    ];
    for (file, gpu) in EXAMPLES.iter().chain(&builtin) {
        let args = ["plan", "--profile", file, "--gpu", gpu, "--plugin", "dra"];
        let out = gpu_share(&[&args[..], &["--node-name", "worker-1", "-o", "json"]].concat());
        assert!(out.status.success(), "{file}: {}", stderr(&out));
        let plan = json(&out);
        let advertised: u64 = (plan["resources"].as_object().unwrap().values())
            .map(|n| n.as_u64().unwrap())
            .sum();
        let slices = plan["resourceSlices"].as_array().unwrap();
        let devices: usize = (slices.iter())
            .map(|s| s["spec"]["devices"].as_array().map_or(0, Vec::len))
            .sum();
        assert_eq!(devices as u64, advertised, "{file} on {gpu}");
        for slice in slices {
            assert_eq!(slice["apiVersion"], "resource.k8s.io/v1");
            assert_eq!(slice["spec"]["driver"], "gpu.gpu-share.dev");
            assert_eq!(slice["spec"]["nodeName"], "worker-1");
            assert_eq!(slice["spec"]["pool"]["name"], "worker-1");
            assert_eq!(slice["spec"]["pool"]["resourceSliceCount"], slices.len());
        }
        assert!(plan.get("devicePluginConfig").is_none(), "{file}");
        // YAML writes attribute values as the API's `{string: …}` maps, not as YAML tags.
        let out = gpu_share(&[&args[..], &["-o", "yaml"]].concat());
        assert!(out.status.success(), "{file}: {}", stderr(&out));
        let yaml = stdout(&out);
        assert!(
            yaml.contains("sharing:\n          string: "),
            "{file}: {yaml}"
        );
        assert!(!yaml.contains(" !"), "{file}: a YAML tag in {yaml}");
        let text = stdout(&gpu_share(&args));
        assert!(
            text.contains("DRA ResourceSlices (driver gpu.gpu-share.dev"),
            "{text}"
        );
    }
}

#[test]
fn validate_for_dra_accepts_what_only_the_nvidia_plugin_refuses() {
    let file = "profiles/builtin/h100-mixed-sharing.yaml";
    assert!(!gpu_share(&["validate", file]).status.success());
    let out = gpu_share(&["validate", "--plugin", "dra", file]);
    assert!(out.status.success(), "{}", stdout(&out));
}

/// `apply` is node-local: re-partitioning with nothing publishing the ResourceSlices would
/// leave claims on the old devices, so it refuses `--plugin dra` and names the agent, which
/// publishes through the API (the agent itself runs it: tests/agent_dra.rs).
#[test]
fn apply_refuses_dra_and_names_the_agent_that_publishes() {
    let apply = [
        "apply",
        "--plugin",
        "dra",
        "--profile",
        "profiles/exclusive.yaml",
    ];
    let out = gpu_share(&apply);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out)
            .contains("published through the Kubernetes API by `gpu-share agent --plugin dra`"),
        "{}",
        stderr(&out)
    );
}

/// `plan` run on a node with neither `--gpu` nor `--current`: it reads the node's own GPUs
/// through NVML (here the fake library over two H100s with MIG off) and changes nothing.
#[test]
fn plan_without_gpu_plans_the_node_it_runs_on_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("node.json");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/simulated-h100x2.json"),
        &state,
    )
    .unwrap();
    let before = std::fs::read(&state).unwrap();
    let plan = |output: &str| {
        Command::new(env!("CARGO_BIN_EXE_gpu-share"))
            .args(["plan", "--profile", "profiles/h100-balanced.yaml", "-o"])
            .arg(output)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("GPU_SHARE_NVML_LIB", nvidia_ml::cdylib_path())
            .env("FAKE_NVML_STATE", &state)
            .env("FAKE_NVML_LOG", dir.path().join("nvml.log"))
            .output()
            .expect("run gpu-share")
    };
    let text = plan("text");
    assert!(text.status.success(), "{}", stderr(&text));
    let text = stdout(&text);
    assert!(text.contains("GPU 0  NVIDIA H100 80GB HBM3"), "{text}");
    assert!(text.contains("GPU 1  NVIDIA H100 80GB HBM3"), "{text}");
    assert!(!text.contains("GPU 2"), "the node has two GPUs: {text}");
    assert!(
        text.contains("enable MIG mode"),
        "MIG is off on the node: {text}"
    );
    assert!(!text.contains("simulated"), "these GPUs were read: {text}");
    let json = json(&plan("json"));
    assert_eq!(json["gpus"].as_array().map(Vec::len), Some(2), "{json}");
    assert_eq!(
        std::fs::read(&state).unwrap(),
        before,
        "plan changed the node"
    );
    let mutations = nvidia_ml::read_log(dir.path().join("nvml.log"));
    assert!(
        mutations.is_empty(),
        "plan called NVML to change: {mutations:?}"
    );
}

/// Without a driver (no NVML library), `plan` with neither `--gpu` nor `--current` says it
/// could not read the node and how to plan without one, and exits 2 (it could not run).
#[test]
fn plan_without_gpu_on_a_node_without_a_driver_points_at_gpu_and_current() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-share"))
        .args(["plan", "--profile", "profiles/h100-inference.yaml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("GPU_SHARE_NVML_LIB", "/nonexistent/libnvidia-ml.so.1")
        .output()
        .expect("run gpu-share");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    for needle in [
        "cannot load NVML from /nonexistent/libnvidia-ml.so.1",
        "--gpu MODEL[xN]",
        "--current FILE",
    ] {
        assert!(err.contains(needle), "{needle:?} not in: {err}");
    }
}

/// Every subcommand that prints takes `-o` for `--output` (one CLI vocabulary): advise
/// did not.
#[test]
fn advise_takes_dash_o_like_the_other_printing_subcommands() {
    let out = gpu_share(&[
        "advise",
        "--demand",
        "tests/data/advise/demand.yaml",
        "--supply",
        "tests/data/advise/supply.yaml",
        "-o",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json(&out)["plugin"], "nvidia");
}

/// The set-up steps print JSON for scripts too, and `schema` prints YAML on request.
#[test]
fn init_config_and_schema_take_dash_o() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let config_arg = config.display().to_string();
    let first = gpu_share(&[
        "device-plugin",
        "init-config",
        "--plugin-config",
        &config_arg,
        "-o",
        "json",
    ]);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert_eq!(json(&first)["created"], true);
    assert_eq!(json(&first)["path"], config_arg.as_str());
    let again = gpu_share(&[
        "device-plugin",
        "init-config",
        "--plugin-config",
        &config_arg,
        "-o",
        "json",
    ]);
    assert_eq!(json(&again)["created"], false);

    let yaml = gpu_share(&["schema", "-o", "yaml"]);
    assert!(yaml.status.success());
    let schema: serde_json::Value = serde_yaml::from_slice(&yaml.stdout).unwrap();
    let json_schema = json(&gpu_share(&["schema"]));
    assert_eq!(schema, json_schema);
}

/// `plan --plugin dra` on this node's own GPUs reads the agent's dynamic-MIG journal
/// (`--dra-plugin-dir`), so it prints what the agent publishes: an instance a claim made keeps
/// the devices it overlaps published (the counters keep them apart), while without the journal
/// the same instance counts as out of band and withdraws them.
#[test]
fn plan_for_dra_reads_which_instances_claims_made_from_the_journal() {
    use gpu_share::dra::kubelet_plugin::mig_journal::{Entry, Instance, MigJournal, State, FILE};
    use nvidia_ml::state::{ComputeInstance, Gpu, GpuInstance, Place};

    let dir = tempfile::tempdir().unwrap();
    let mut node = nvidia_ml::state::State::with_gpus([
        Gpu::mig("h100-80gb").mig_enabled(),
        Gpu::mig("h100-80gb"),
    ]);
    node.gpus[0].gpu_instances.push(GpuInstance {
        id: 3,
        profile_id: 19,
        placement: Place::new(5, 1),
        compute_instances: vec![ComputeInstance {
            id: 0,
            profile_id: 0,
            placement: Place::new(0, 1),
            uuid: "MIG-claimed".into(),
        }],
    });
    let state = dir.path().join("node.json");
    node.write_to(&state).unwrap();
    let profile = dir.path().join("dyn.yaml");
    std::fs::write(
        &profile,
        "version: v1\nrules:\n  - devices: all\n    dynamicMig: true\n",
    )
    .unwrap();
    let plugin_dir = dir.path().join("plugin");
    std::fs::create_dir(&plugin_dir).unwrap();
    let devices = || -> Vec<String> {
        let out = Command::new(env!("CARGO_BIN_EXE_gpu-share"))
            .args(["plan", "--plugin", "dra", "-o", "json", "--profile"])
            .arg(&profile)
            .arg("--dra-plugin-dir")
            .arg(&plugin_dir)
            .env("GPU_SHARE_NVML_LIB", nvidia_ml::cdylib_path())
            .env("FAKE_NVML_STATE", &state)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        json(&out)["resourceSlices"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .map(|d| d["name"].as_str().unwrap().to_string())
            .collect()
    };
    let out_of_band = devices();
    assert!(!out_of_band.contains(&"gpu-0-mig-5-1g-10gb".to_string()));
    assert!(!out_of_band.contains(&"gpu-0-mig-4-2g-20gb".to_string()));
    assert!(out_of_band.contains(&"gpu-0-mig-4-1g-10gb".to_string()));

    MigJournal {
        entries: vec![Entry {
            claim: "uid-1".into(),
            claim_name: "team-a/small".into(),
            device: "gpu-0-mig-5-1g-10gb".into(),
            gpu: 0,
            instance: Some(Instance {
                profile: "1g.10gb".into(),
                placement: gpu_share::mig::Placement { start: 5, size: 1 },
                gi_id: Some(3),
            }),
            state: State::Made,
        }],
    }
    .save(&plugin_dir.join(FILE))
    .unwrap();
    let claimed = devices();
    assert!(
        claimed.contains(&"gpu-0-mig-5-1g-10gb".to_string()),
        "{claimed:?}"
    );
    assert!(
        claimed.contains(&"gpu-0-mig-4-2g-20gb".to_string()),
        "{claimed:?}"
    );
    assert!(claimed.contains(&"gpu-0".to_string()), "{claimed:?}");
}

/// The fractional example (`mps.consumable`, DRA only): refused for both device plugins with a
/// message naming `--plugin dra`, valid for DRA, in the schema, and planned as one consumable
/// device per GPU whose text summary says how claims are rounded.
#[test]
fn the_fractional_example_is_dra_only_and_plans_consumable_devices() {
    let file = "profiles/dra/h100-fractional.yaml";
    valid_for_dra_only(file, "mps.consumable needs `--plugin dra`");
    let schema = stdout(&gpu_share(&["schema"]));
    assert!(schema.contains("\"consumable\"") && schema.contains("ComputePolicy"));
    let text = gpu_share(&[
        "plan",
        "--plugin",
        "dra",
        "--profile",
        file,
        "--gpu",
        "h100x2",
    ]);
    assert!(
        stdout(&text).contains("MPS, consumable by up to 16 claims: 81559 MiB of memory"),
        "{}",
        stdout(&text)
    );
    let plan = json(&gpu_share(&[
        "plan",
        "--plugin",
        "dra",
        "--profile",
        file,
        "--gpu",
        "h100x2",
        "-o",
        "json",
    ]));
    let devices: Vec<serde_json::Value> = plan["resourceSlices"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .collect();
    assert_eq!(devices.len(), 2);
    assert!(devices
        .iter()
        .all(|d| d["allowMultipleAllocations"] == true));
    assert_eq!(devices[1]["name"], "gpu-1-mps");
}
