//! The rules the whole command tree follows, one CLI vocabulary: every argument says what it is
//! for, every agent and autopilot flag can be set from the environment (they run as a DaemonSet
//! and a Deployment), one setting has one name everywhere, durations are written `15s`/`5m` under
//! names without a unit, and the spellings that replaced older ones still parse.

use clap::{Arg, Command, CommandFactory};

use super::Cli;

/// Every subcommand with its path (`gpu-share agent`), the root included.
fn commands() -> Vec<(String, Command)> {
    fn walk(path: String, cmd: &Command, out: &mut Vec<(String, Command)>) {
        out.push((path.clone(), cmd.clone()));
        for sub in cmd.get_subcommands() {
            walk(format!("{path} {}", sub.get_name()), sub, out);
        }
    }
    let mut root = Cli::command();
    root.build();
    let mut out = Vec::new();
    walk("gpu-share".into(), &root, &mut out);
    out
}

/// clap's own `--help` and `--version`.
fn is_builtin(arg: &Arg) -> bool {
    matches!(arg.get_id().as_str(), "help" | "version")
}

fn named(arg: &Arg) -> String {
    arg.get_long()
        .map_or_else(|| arg.get_id().to_string(), |l| format!("--{l}"))
}

#[test]
fn every_argument_has_help() {
    let missing: Vec<String> = commands()
        .iter()
        .flat_map(|(path, cmd)| {
            cmd.get_arguments()
                .filter(|a| !is_builtin(a) && !a.is_hide_set() && a.get_help().is_none())
                .map(move |a| format!("{path} {}", named(a)))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(missing.is_empty(), "arguments without help: {missing:#?}");
}

/// The agent (a DaemonSet) and the autopilot (a Deployment) are configured through their
/// pod's environment, as their docs promise: every flag has its variable.
#[test]
fn every_agent_and_autopilot_flag_has_an_env_var() {
    let mut missing = Vec::new();
    for (path, cmd) in commands() {
        if path != "gpu-share agent" && path != "gpu-share autopilot" {
            continue;
        }
        missing.extend(
            cmd.get_arguments()
                .filter(|a| !is_builtin(a) && !a.is_global_set() && a.get_long().is_some())
                .filter(|a| a.get_env().is_none())
                .map(|a| format!("{path} {}", named(a))),
        );
    }
    assert!(missing.is_empty(), "flags without an env var: {missing:?}");
}

/// One name per setting: wherever two subcommands read the same environment variable,
/// their flag has the same name (`--mps-root`, `--host-root`, `--max-concurrent-drains`).
#[test]
fn one_flag_name_per_env_var() {
    let mut names: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for (path, cmd) in commands() {
        for arg in cmd.get_arguments() {
            if let Some(env) = arg.get_env() {
                names
                    .entry(env.to_string_lossy().into_owned())
                    .or_default()
                    .insert(format!("{} ({path})", named(arg)));
            }
        }
    }
    let clashes: Vec<String> = names
        .into_iter()
        .filter(|(_, flags)| {
            let distinct: std::collections::BTreeSet<&str> =
                flags.iter().filter_map(|f| f.split(' ').next()).collect();
            distinct.len() > 1
        })
        .map(|(env, flags)| format!("{env}: {flags:?}"))
        .collect();
    assert!(
        clashes.is_empty(),
        "one setting, several names: {clashes:#?}"
    );
}

/// The spellings the vocabulary replaced are hidden aliases, so scripts and manifests
/// written for them keep working, bare numbers in the old unit.
#[test]
fn old_spellings_still_parse() {
    use std::time::Duration;

    use clap::Parser;

    use super::setup::MpsCommand;
    use super::Command as Sub;

    let cli = Cli::try_parse_from([
        "gpu-share",
        "agent",
        "--node-name=n",
        "--drain-timeout-secs=600",
        "--eviction-backoff-ms=500",
        "--lease-duration-secs=30",
        "--resync-secs=60",
        "--api-timeout-secs=5",
    ])
    .expect("old agent spellings");
    let Sub::Agent(agent) = cli.command else {
        panic!("not the agent")
    };
    assert_eq!(agent.drain_timeout, Duration::from_secs(600));
    assert_eq!(agent.eviction_backoff, Duration::from_millis(500));
    assert_eq!(agent.lease_duration, Duration::from_secs(30));
    assert_eq!(agent.resync_period, Duration::from_secs(60));
    assert_eq!(agent.api_timeout, Duration::from_secs(5));

    let cli = Cli::try_parse_from([
        "gpu-share",
        "autopilot",
        "--debounce-seconds=0.5",
        "--lease-duration-seconds=20",
        "--max-changing-nodes=3",
    ])
    .expect("old autopilot spellings");
    let Sub::Autopilot(autopilot) = cli.command else {
        panic!("not the autopilot")
    };
    assert_eq!(autopilot.debounce, Duration::from_millis(500));
    assert_eq!(autopilot.lease_duration, Duration::from_secs(20));
    assert_eq!(autopilot.max_concurrent_drains, 3);

    let cli = Cli::try_parse_from(["gpu-share", "mps", "mount-shm", "--root=/r"])
        .expect("old mount-shm spelling");
    let Sub::Mps(MpsCommand::MountShm(shm)) = cli.command else {
        panic!("not mount-shm")
    };
    assert_eq!(shm.mps_root, std::path::Path::new("/r"));

    let cli = Cli::try_parse_from([
        "gpu-share",
        "doctor",
        "--root=/host",
        "--cdi-dir=/a",
        "--cdi-root=/b",
    ])
    .expect("old doctor spellings");
    let Sub::Doctor(doctor) = cli.command else {
        panic!("not doctor")
    };
    assert_eq!(doctor.checks.host_root, std::path::Path::new("/host"));
    assert_eq!(
        doctor.checks.cdi_roots,
        ["/a", "/b"].map(std::path::PathBuf::from)
    );
}

#[test]
fn new_spellings_take_kubernetes_durations() {
    use clap::Parser;

    let cli = Cli::try_parse_from([
        "gpu-share",
        "agent",
        "--node-name=n",
        "--drain-timeout=15m",
        "--eviction-backoff=250ms",
    ])
    .unwrap();
    let super::Command::Agent(agent) = cli.command else {
        panic!("not the agent")
    };
    assert_eq!(agent.drain_timeout, std::time::Duration::from_secs(900));
    assert_eq!(
        agent.eviction_backoff,
        std::time::Duration::from_millis(250)
    );
    let err = Cli::try_parse_from(["gpu-share", "agent", "--node-name=n", "--lease-duration=0s"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--lease-duration") && err.contains("from 1s to 1h"),
        "{err}"
    );
}

#[test]
fn no_flag_names_a_duration_unit() {
    let units = ["-secs", "-seconds", "-ms", "-millis", "-minutes"];
    let bad: Vec<String> = commands()
        .iter()
        .flat_map(|(path, cmd)| {
            cmd.get_arguments()
                .filter(|a| !a.is_hide_set())
                .filter_map(|a| a.get_long())
                .filter(|l| units.iter().any(|u| l.ends_with(u)))
                .map(move |l| format!("{path} --{l}"))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        bad.is_empty(),
        "durations are given as 15s/5m under a name without a unit: {bad:?}"
    );
}

#[test]
fn env_vars_of_durations_carry_no_unit_either() {
    let bad: Vec<String> = commands()
        .iter()
        .flat_map(|(_, cmd)| {
            cmd.get_arguments()
                .filter_map(|a| a.get_env())
                .map(|e| e.to_string_lossy().into_owned())
                .filter(|e| ["_SECS", "_SECONDS", "_MS"].iter().any(|u| e.ends_with(u)))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(bad.is_empty(), "{bad:?}");
}
