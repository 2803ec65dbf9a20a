//! Reliability suite: gpu-share under the failures a production GPU node sees, run as an
//! operator runs it — `gpu-share apply` and the `gpu-share agent` process, against the fake
//! `libnvidia-ml.so` (tests/fake-nvml), the Kubernetes API double (tests/kube-double) and the
//! fake `nvidia-cuda-mps-control` (tests/fake-mps-control).
//!
//! Every test checks the same three promises:
//! - no GPU instance is orphaned (every GPU instance has its compute instance) and the MIG
//!   layout matches the old or the new profile once things settle;
//! - no pod outside the affected set (pods whose processes run on instances that change) is
//!   evicted, and no pod is deleted behind the Eviction API's back;
//! - no PodDisruptionBudget is violated: a guarded pod is evicted only once its budget allows.
//!
//! Fast part (in `cargo test --workspace`): a crash at every mutation of 4 transitions on
//! 2 GPUs, and of 2 of the 20 on 8 GPUs picked by a printed seed (`GPU_SHARE_TEST_SEED`
//! replays it); watch drops and API 5xx/slow answers during a drain; a PDB that never allows the
//! eviction; a hung Node patch and a lost uncordon; a device plugin that is gone (and its
//! reload retried until it is back); an MPS daemon killed with SIGKILL; an unwritable state dir
//! (CLI and agent); the profile parser and ConfigMap reader on mutated inputs.
//!
//! Opt-in part (`cargo test --test reliability -- --ignored`, a few minutes): a crash at every
//! mutation of every transition of the suite (20, 8 GPUs), and 10,000 mutated parser inputs.
//!
//! The simulated node (fake NVML state, host fixtures, simulated kubelet) is shared with the
//! other tests and the whole-process benchmarks: the `node-sim` crate (tests/node-sim).

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kube_double::{fixtures, EvictionOutcome, Fault, KubeDouble, Verb};
use node_sim::*;

// -------------------------------------------------------------------------------------------
// Crash at every mutation, then convergence
// -------------------------------------------------------------------------------------------
// `crash_at_every_mutation` (node-sim) crashes `apply` right before each mutation of a
// transition, then runs `apply --resume`: every run must converge with nothing orphaned.

#[test]
fn a_crash_at_every_mutation_of_a_sample_of_transitions_converges() {
    // One transition of each kind: destroy some and create (MIG stays on), enable MIG and
    // create everything, destroy everything and disable MIG, and one with MIG off on both
    // sides (no NVML mutation: nothing to crash at).
    let mut points = 0;
    for (from, to) in [
        ("h100-inference", "h100-balanced"),
        ("exclusive", "a100-80gb-single"),
        ("h100-balanced", "homelab-timeslice"),
        ("exclusive", "homelab-timeslice"),
    ] {
        let n = crash_at_every_mutation(from, to, 2, |_, _, _| {});
        assert_crash_points_match_mig_use(from, to, n);
        points += n;
    }
    eprintln!("4 transitions on 2 GPUs: {points} crash points, all converged");
    assert!(points >= 30, "{points} crash points");
}

/// How many transitions of the full matrix below each CI run covers (about 20 s each in a
/// debug build), from a seeded start, so successive runs cover all 20.
const TRANSITIONS_PER_RUN: usize = 2;
/// Not a time box: a run past it fails, saying so, rather than hang CI.
const CRASH_MATRIX_GUARD: Duration = Duration::from_secs(600);

/// The run CI makes of the full matrix below: [`TRANSITIONS_PER_RUN`] transitions on 8 GPUs
/// in turn, starting at one the printed seed picks (`GPU_SHARE_TEST_SEED` replays a run).
#[test]
fn a_crash_at_every_mutation_of_seeded_transitions_converges() {
    let all = transitions();
    let seed = test_seed("crash matrix");
    let first = (seed % all.len() as u64) as usize;
    let started = std::time::Instant::now();
    let mut covered = Vec::new();
    for (from, to) in all.iter().cycle().skip(first).take(TRANSITIONS_PER_RUN) {
        let n = crash_at_every_mutation(from, to, 8, |_, _, _| {});
        assert_crash_points_match_mig_use(from, to, n);
        covered.push(format!("{from} → {to} ({n} crash points)"));
        assert!(
            started.elapsed() < CRASH_MATRIX_GUARD,
            "seed {seed}: past the {CRASH_MATRIX_GUARD:?} guard after {covered:?}"
        );
    }
    eprintln!(
        "seed {seed}: {} of {} transitions on 8 GPUs in {:.0}s, all converged: {}",
        covered.len(),
        all.len(),
        started.elapsed().as_secs_f64(),
        covered.join(", ")
    );
    assert_eq!(covered.len(), TRANSITIONS_PER_RUN);
}

/// A transition that touches MIG has NVML mutations to crash at; one between two profiles
/// without MIG (exclusive ↔ homelab-timeslice) has none, and its clean apply was still checked.
fn assert_crash_points_match_mig_use(from: &str, to: &str, crash_points: usize) {
    let touches_mig = profile_uses_mig(from) || profile_uses_mig(to);
    assert_eq!(
        crash_points > 0,
        touches_mig,
        "{from} → {to}: {crash_points} crash points, but the transition {} MIG",
        if touches_mig {
            "touches"
        } else {
            "does not touch"
        }
    );
}

#[test]
#[ignore = "opt-in, a few minutes: cargo test --test reliability -- --ignored"]
fn a_crash_at_every_mutation_of_every_transition_converges() {
    let mut points = 0;
    for (from, to) in transitions() {
        let n = crash_at_every_mutation(from, to, 8, |_, _, _| {});
        assert_crash_points_match_mig_use(from, to, n);
        eprintln!("{from} → {to}: {n} crash points converged");
        points += n;
    }
    eprintln!("20 transitions on 8 GPUs: {points} crash points, all converged");
    assert_eq!(transitions().len(), 20);
}

// -------------------------------------------------------------------------------------------
// Drains under API faults and budgets
// -------------------------------------------------------------------------------------------

/// One H100 with h100-balanced applied by a running agent, and three pods: `moves` on the
/// 3g.40gb that h100-inference destroys, `stays` on a 1g.10gb it keeps, and `web`, a pod
/// without a GPU. Only `moves` is in the affected set of balanced → inference.
fn balanced_node_with_pods(
    api: &Arc<KubeDouble>,
    name: &str,
    extra: &[&str],
    env: &[(&str, String)],
) -> AgentNode {
    profiles_configmap(api, &["h100-balanced", "h100-inference"], &[]);
    let mut node = AgentNode::new(api, name, h100s(1, true));
    api.set_node_label(name, PROFILE_LABEL, Some("h100-balanced"));
    node.start_agent(extra, env);
    wait_applied(api, &node, "h100-balanced", Duration::from_secs(30));
    wait_gpus_labelled(api, &node);
    let (moves, stays) = (node.gi_at(0, 4), node.gi_at(0, 0));
    node.add_workloads(
        api,
        &[
            Workload {
                pod: "moves".into(),
                pid: 4001,
                gpu: 0,
                gi: Some(moves),
            },
            Workload {
                pod: "stays".into(),
                pid: 4002,
                gpu: 0,
                gi: Some(stays),
            },
        ],
    );
    api.put_pod(fixtures::running_pod(
        "default",
        "web",
        name,
        &[("app", "web")],
    ));
    node
}

/// Ask for h100-inference and wait until the agent drains (the guarded `moves` holds it there).
fn drain_for_inference(api: &KubeDouble, node: &AgentNode) {
    api.set_node_label(&node.name, PROFILE_LABEL, Some("h100-inference"));
    wait_state(api, node, "draining", Duration::from_secs(30));
}

/// The three promises, for a node that ends on profile `settled` (its layout is checked),
/// where only `affected` pods may be evicted and every `bystanders` pod must still run.
fn assert_promises(
    api: &KubeDouble,
    node: &AgentNode,
    settled: &str,
    affected: &[&str],
    bystanders: &[&str],
) {
    let what = format!("{} on {settled}", node.name);
    assert_no_orphans(&node.nvml(), &what);
    let left = pending_steps(settled, &observe(&node.nvml_state()));
    assert!(left.is_empty(), "{what}: MIG steps left: {left:?}");
    for e in api.evictions() {
        assert!(
            affected.contains(&e.pod.as_str()),
            "{what}: eviction of {} outside the affected set {affected:?}: {e:?}",
            e.pod
        );
    }
    for pod in bystanders {
        assert!(
            api.pod("default", pod).is_some(),
            "{what}: {pod} is gone although it was not affected"
        );
    }
    let deletes = direct_pod_deletes(api);
    assert!(
        deletes.is_empty(),
        "{what}: pods deleted outside the Eviction API: {deletes:?}"
    );
}

/// No `Evicted` record for `pod` before `allowed_from` (when its budget began to allow it), or
/// none at all when it never did.
fn assert_budget_respected(api: &KubeDouble, pod: &str, allowed_from: Option<SystemTime>) {
    for e in api.evictions().iter().filter(|e| e.pod == pod) {
        if e.outcome == EvictionOutcome::Evicted {
            let ok = allowed_from.is_some_and(|t| e.at >= t);
            assert!(ok, "{pod} evicted while its budget disallowed it: {e:?}");
        }
    }
}

#[test]
fn watch_drops_and_api_errors_during_a_drain_are_survived() {
    let api = Arc::new(KubeDouble::start());
    let node = balanced_node_with_pods(&api, "gpu-faults", &[], &[]);
    guard(&api, "moves", "moves");
    drain_for_inference(&api, &node);
    assert!(
        api.wait_until(Duration::from_secs(10), |a| a
            .evictions()
            .iter()
            .any(|e| e.code == 429)),
        "the budget refuses first"
    );

    // Mid-drain: every watch dropped and its history compacted (the watchers must re-list),
    // eviction answers 500, 503, 504 and a slow one, node patches and pod lists 503 (kube's
    // client retries those itself).
    let dropped = api.drop_watches();
    assert!(dropped >= 2, "node and ConfigMap watches open: {dropped}");
    api.compact();
    api.fail_next(Verb::Create, "pods/eviction", 2, Fault::Status(500));
    api.fail_next(Verb::Create, "pods/eviction", 2, Fault::Status(503));
    api.fail_next(Verb::Create, "pods/eviction", 1, Fault::Status(504));
    api.fail_next(
        Verb::Create,
        "pods/eviction",
        1,
        Fault::Delay(Duration::from_secs(2)),
    );
    api.fail_next(Verb::Patch, "nodes", 2, Fault::Status(503));
    api.fail_next(Verb::List, "pods", 2, Fault::Status(503));
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(state_of(&api, &node.name).as_deref(), Some("draining"));
    assert!(unschedulable(&api, &node.name), "cordoned while draining");

    // The budget allows it now.
    let allowed_from = SystemTime::now();
    api.remove::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(Some("default"), "moves");
    wait_applied(&api, &node, "h100-inference", Duration::from_secs(60));
    assert!(
        api.wait_until(Duration::from_secs(10), |a| !unschedulable(a, &node.name)),
        "uncordoned after the change\n{}",
        node.log()
    );
    assert!(annotation(&api, &node.name, CORDONED).is_none());

    assert_eq!(evicted(&api), ["moves".to_string()].into());
    let injected = api
        .evictions()
        .iter()
        .filter(|e| e.outcome == EvictionOutcome::Injected)
        .count();
    assert!(
        injected >= 5,
        "the injected eviction faults were hit: {injected}"
    );
    assert_budget_respected(&api, "moves", Some(allowed_from));
    assert_promises(&api, &node, "h100-inference", &["moves"], &["stays", "web"]);
    assert!(api.pod("default", "stays").is_some() && api.pod("default", "web").is_some());
    // balanced → inference on one GPU destroys only the 3g.40gb.
    assert_eq!(node.count("nvmlGpuInstanceDestroy"), 1);
}

#[test]
fn a_pdb_that_never_allows_eviction_times_out_uncordons_and_changes_nothing() {
    let api = Arc::new(KubeDouble::start());
    let node = balanced_node_with_pods(&api, "gpu-pdb", &["--drain-timeout", "3s"], &[]);
    guard(&api, "moves", "moves");
    let before = node.mutations().len();
    let layout_before = node.nvml();

    drain_for_inference(&api, &node);
    assert!(unschedulable(&api, &node.name), "cordoned while draining");
    wait_state(&api, &node, "failed", Duration::from_secs(30));
    let reason = annotation(&api, &node.name, REASON).unwrap();
    assert!(
        reason.contains("drain timed out")
            && reason.contains("default/moves")
            && reason.contains("PodDisruptionBudget"),
        "{reason}"
    );
    // Documented: a drain that times out fails and uncordons (the retry, after a backoff of
    // at least 5 s, cordons again).
    assert!(
        !unschedulable(&api, &node.name),
        "uncordoned after giving up"
    );
    assert!(annotation(&api, &node.name, CORDONED).is_none());
    assert_eq!(
        node.mutations().len(),
        before,
        "nothing changed on the GPUs"
    );
    let after = node.nvml();
    for (b, a) in layout_before.gpus.iter().zip(&after.gpus) {
        assert_eq!(layout(b), layout(a), "the layout is h100-balanced's");
    }
    assert!(
        api.pod("default", "moves").is_some(),
        "the guarded pod runs"
    );
    let blocked = api
        .evictions()
        .iter()
        .filter(|e| matches!(e.outcome, EvictionOutcome::Blocked { .. }))
        .count();
    assert!(blocked >= 2, "refusals retried with backoff: {blocked}");
    assert_budget_respected(&api, "moves", None);
    assert_promises(&api, &node, "h100-balanced", &["moves"], &["stays", "web"]);
}

// -------------------------------------------------------------------------------------------
// The device plugin and the MPS daemons
// -------------------------------------------------------------------------------------------

/// A stand-in for the device plugin: a shell that appends a line to `hups` on every SIGHUP.
fn fake_plugin(hups: &Path) -> Child {
    std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "trap 'echo hup >> \"{}\"' HUP; while :; do sleep 0.05; done",
            hups.display()
        ))
        .spawn()
        .expect("start the stand-in plugin")
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |s| s.lines().count())
}

/// An agent that reloads a stand-in plugin by its pid file, with h100-balanced applied.
struct SignalledPlugin {
    node: AgentNode,
    plugin: Child,
    pid_file: PathBuf,
    /// One line per SIGHUP the plugin got.
    hups: PathBuf,
}

fn agent_signalling_a_plugin(api: &Arc<KubeDouble>, name: &str) -> SignalledPlugin {
    profiles_configmap(api, &["h100-balanced", "h100-inference"], &[]);
    let mut node = AgentNode::new(api, name, h100s(1, true));
    let (pid_file, hups) = (node.path("plugin.pid"), node.path("hups"));
    let plugin = fake_plugin(&hups);
    std::fs::write(&pid_file, plugin.id().to_string()).unwrap();
    let pid_arg = pid_file.display().to_string();
    node.start_agent(
        &["--plugin-reload", "signal", "--plugin-pid-file", &pid_arg],
        &[],
    );
    api.set_node_label(&node.name, PROFILE_LABEL, Some("h100-balanced"));
    wait_applied(api, &node, "h100-balanced", Duration::from_secs(30));
    SignalledPlugin {
        node,
        plugin,
        pid_file,
        hups,
    }
}

impl SignalledPlugin {
    /// The plugin dies and is not restarted (its pid file stays behind), then the label asks
    /// for h100-inference: the apply fails at the reload. The dead plugin's PID.
    fn plugin_dies_before_the_next_profile(&mut self, api: &KubeDouble) -> u32 {
        let dead = self.plugin.id();
        self.plugin.kill().unwrap();
        self.plugin.wait().unwrap();
        api.set_node_label(&self.node.name, PROFILE_LABEL, Some("h100-inference"));
        wait_state(api, &self.node, "failed", Duration::from_secs(30));
        dead
    }
}

#[test]
fn a_device_plugin_that_does_not_come_back_fails_the_apply_with_its_pid() {
    let api = Arc::new(KubeDouble::start());
    let mut sp = agent_signalling_a_plugin(&api, "gpu-plugin");
    let hups = sp.hups.clone();
    assert!(
        poll(Duration::from_secs(5), Duration::from_millis(20), || lines(
            &hups
        ) == 1),
        "the plugin got one SIGHUP for the new config: {}",
        lines(&hups)
    );

    // The plugin dies and is not restarted; its pid file stays behind.
    let dead = sp.plugin_dies_before_the_next_profile(&api);
    let node = &sp.node;
    let reason = annotation(&api, &node.name, REASON).unwrap();
    assert!(
        reason.contains(&format!("cannot signal the device plugin (PID {dead})")),
        "{reason}"
    );
    assert!(
        !unschedulable(&api, &node.name),
        "uncordoned after the failure"
    );
    // The GPUs were reconfigured and the config written before the signal: the node holds
    // the new layout, nothing orphaned, and the file names the new resources.
    assert_promises(&api, node, "h100-inference", &[], &[]);
    let config = std::fs::read_to_string(node.plugin_config()).unwrap();
    assert!(config.contains("h100-inference"), "{config}");
}

#[test]
fn a_failed_device_plugin_reload_is_retried_until_the_plugin_is_back() {
    let api = Arc::new(KubeDouble::start());
    let mut sp = agent_signalling_a_plugin(&api, "gpu-plugin-back");
    let dead = sp.plugin_dies_before_the_next_profile(&api);
    let (node, pid_file) = (&sp.node, &sp.pid_file);
    let signal_failed = format!("cannot signal the device plugin (PID {dead})");
    // The retry (backoff 5 s) finds the config file already up to date: the reload it still
    // owes must be tried again, and fail again, not be taken as done.
    let failures = || node.log().matches(&signal_failed).count();
    let first = failures();
    assert!(first >= 1, "{}", node.log());
    assert!(
        poll(
            Duration::from_secs(15),
            Duration::from_millis(50),
            || failures() > first
        ),
        "no retry of the reload\n{}",
        node.log()
    );
    assert_eq!(state_of(&api, &node.name).as_deref(), Some("failed"));
    let reason = annotation(&api, &node.name, REASON).unwrap();
    assert!(reason.contains(&signal_failed), "{reason}");
    let config = std::fs::read_to_string(node.plugin_config()).unwrap();
    assert!(config.contains("h100-inference"), "{config}");
    assert!(!unschedulable(&api, &node.name));

    // The plugin comes back (a new process, its pid file rewritten): the next retry signals it
    // once, the profile is applied, and no reload is owed any more.
    let back_hups = node.path("hups-back");
    let mut back = fake_plugin(&back_hups);
    std::fs::write(pid_file, back.id().to_string()).unwrap();
    wait_applied(&api, node, "h100-inference", Duration::from_secs(30));
    assert!(
        poll(Duration::from_secs(5), Duration::from_millis(20), || lines(
            &back_hups
        ) == 1),
        "the plugin that came back got one SIGHUP: {}",
        lines(&back_hups)
    );
    std::thread::sleep(Duration::from_millis(2500)); // a resync: nothing owed, nothing sent
    assert_eq!(
        lines(&back_hups),
        1,
        "signalled again after the reload succeeded"
    );
    assert!(!node.path("state/device-plugin-reload-owed").exists());
    back.kill().unwrap();
    back.wait().unwrap();
    assert_promises(&api, node, "h100-inference", &[], &[]);
}

#[test]
fn an_mps_daemon_killed_with_sigkill_is_restarted_by_the_periodic_resync() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api, &["h100-mps"], &[]);
    let mut node = AgentNode::new(&api, "gpu-mps", h100s(2, false));
    node.start_agent(&[], &[]); // --resync-period 2s
    api.set_node_label(&node.name, PROFILE_LABEL, Some("h100-mps"));
    wait_applied(&api, &node, "h100-mps", Duration::from_secs(30));
    let root = node.path("mps");
    let pid_file = root.join("nvidia.com/gpu/pipe/nvidia-cuda-mps-control.pid");
    let ready = root.join(".ready");
    assert!(ready.exists(), "every daemon up");
    let old = read_pid(&pid_file).expect("daemon pid file");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let restarted = poll(Duration::from_secs(20), Duration::from_millis(50), || {
        read_pid(&pid_file).is_some_and(|p| p != old && alive(p)) && ready.exists()
    });
    assert!(
        restarted,
        "daemon not restarted: pid file {:?}, .ready {}\n{}",
        read_pid(&pid_file),
        ready.exists(),
        node.log()
    );
    assert_eq!(state_of(&api, &node.name).as_deref(), Some("success"));
    // No MIG change for MPS: only EXCLUSIVE_PROCESS, once per GPU, not again on a resync.
    let mutations: Vec<String> = node.mutations().into_iter().map(|e| e.function).collect();
    assert_eq!(mutations, ["nvmlDeviceSetComputeMode"; 2]);
    assert!(api.evictions().is_empty() && !unschedulable(&api, &node.name));
    assert_promises(&api, &node, "h100-mps", &[], &[]);
}

/// A live process (not a zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

// -------------------------------------------------------------------------------------------
// A state dir that cannot be written
// -------------------------------------------------------------------------------------------

#[test]
fn apply_with_an_unwritable_state_dir_fails_before_the_first_mutation() {
    let node = CliNode::new(h100s(2, false));
    let initial = node.fake_state();
    // A path under a regular file: ENOTDIR even for root.
    let file = node.dir.path().join("not-a-dir");
    std::fs::write(&file, "").unwrap();
    let dir = file.join("state");
    let out = node.gpu_share(
        &["apply", "--profile", &profile_path("h100-inference")],
        &[("GPU_SHARE_STATE_DIR", dir.display().to_string())],
    );
    assert_refused_untouched(&node, &initial, &dir, &out);
}

/// A read-only state dir. Root writes through a directory's mode, so as root the dir is
/// mounted read-only in a mount namespace of the command's own (`unshare --mount`); as
/// anyone else it is mode 0555. Root without mount namespaces cannot make one: ignored then.
#[test]
#[cfg_attr(
    root_without_mount_namespace,
    ignore = "running as root without mount namespaces: no read-only state dir can be made"
)]
fn apply_with_a_read_only_state_dir_fails_before_the_first_mutation() {
    use std::os::unix::fs::PermissionsExt;
    let node = CliNode::new(h100s(2, false));
    let initial = node.fake_state();
    let dir = node.dir.path().join("read-only");
    std::fs::create_dir(&dir).unwrap();
    let env = [("GPU_SHARE_STATE_DIR", dir.display().to_string())];
    let cmd = node.command(
        &["apply", "--profile", &profile_path("h100-inference")],
        &env,
    );
    // A directory we create is owned by our effective uid.
    let root = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&dir).unwrap()) == 0;
    let out = if root {
        read_only_mount(&dir, &cmd).output().unwrap()
    } else {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o555)).unwrap();
        let mut cmd = cmd;
        cmd.output().unwrap()
    };
    assert_refused_untouched(&node, &initial, &dir, &out);
}

/// `cmd` run with `dir` bind-mounted read-only over itself, in a mount namespace of its own.
fn read_only_mount(dir: &Path, cmd: &std::process::Command) -> std::process::Command {
    let mut wrapped = std::process::Command::new("unshare");
    wrapped
        .args(["--mount", "sh", "-c"])
        .arg(r#"mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@""#)
        .arg("sh")
        .arg(dir)
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (key, value) in cmd.get_envs() {
        match value {
            Some(value) => wrapped.env(key, value),
            None => wrapped.env_remove(key),
        };
    }
    if let Some(cwd) = cmd.get_current_dir() {
        wrapped.current_dir(cwd);
    }
    wrapped
}

/// `out` failed naming the journal in `dir`, and nothing on the GPUs changed.
fn assert_refused_untouched(
    node: &CliNode,
    initial: &nvidia_ml::State,
    dir: &Path,
    out: &std::process::Output,
) {
    assert!(!out.status.success(), "{}", text(out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("cannot write the journal in {}", dir.display())),
        "the error names the dir: {stderr}"
    );
    assert!(node.mutations().is_empty(), "a GPU was touched: {stderr}");
    assert_eq!(&node.fake_state(), initial, "the GPUs changed");
}

#[test]
fn the_agent_with_an_unwritable_state_dir_fails_before_cordoning_or_evicting() {
    let api = Arc::new(KubeDouble::start());
    let mut node = balanced_node_with_pods(&api, "gpu-disk", &[], &[]);
    let before = node.nvml();
    let mutations = node.mutations().len();
    // The agent restarts with its state dir unusable (a file where the directory should be).
    node.kill_agent();
    let file = node.path("state-file");
    std::fs::write(&file, "").unwrap();
    let bad = file.join("state");
    node.start_agent(&[], &[("GPU_SHARE_STATE_DIR", bad.display().to_string())]);
    api.clear_requests();
    api.set_node_label(&node.name, PROFILE_LABEL, Some("h100-inference"));
    wait_state(&api, &node, "failed", Duration::from_secs(30));
    let reason = annotation(&api, &node.name, REASON).unwrap();
    assert!(
        reason.contains(&format!("cannot write the journal in {}", bad.display()))
            && reason.contains("nothing was cordoned or evicted"),
        "{reason}"
    );
    // The retry (after 5 s) fails the same way, before the drain slot and the cordon.
    std::thread::sleep(Duration::from_millis(5500));
    assert_eq!(state_of(&api, &node.name).as_deref(), Some("failed"));
    assert!(!unschedulable(&api, &node.name), "never cordoned");
    let cordons: Vec<_> = api
        .events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Cordoned"))
        .filter(|e| {
            e.note
                .as_deref()
                .is_some_and(|n| n.contains("h100-inference"))
        })
        .collect();
    assert!(cordons.is_empty(), "cordoned: {cordons:?}");
    let leases: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.resource == "leases" && r.method != "GET")
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(leases.is_empty(), "a drain slot was taken: {leases:?}");
    assert_eq!(
        node.mutations().len(),
        mutations,
        "nothing changed on the GPUs"
    );
    for (b, a) in before.gpus.iter().zip(&node.nvml().gpus) {
        assert_eq!(layout(b), layout(a));
    }
    assert!(api.evictions().is_empty(), "evicted: {:?}", api.evictions());
    assert_promises(
        &api,
        &node,
        "h100-balanced",
        &[],
        &["moves", "stays", "web"],
    );
}

// -------------------------------------------------------------------------------------------
// The profile parser and the ConfigMap reader on mutated inputs (the stable-toolchain
// counterpart of the cargo-fuzz targets in fuzz/)
// -------------------------------------------------------------------------------------------

mod parser {
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};

    use gpu_share::plan::{plan, NodePlan, ObservedNode};
    use gpu_share::profile::{parse_profile, read_profiles};
    use gpu_share::validate::validate;
    use node_sim::test_seed;
    use proptest::prelude::*;
    use proptest::test_runner::RngSeed;

    const SEEDS: &[&str] = &[
        include_str!("../profiles/a100-40gb-mixed.yaml"),
        include_str!("../profiles/a100-80gb-single.yaml"),
        include_str!("../profiles/exclusive.yaml"),
        include_str!("../profiles/h100-balanced.yaml"),
        include_str!("../profiles/h100-inference.yaml"),
        include_str!("../profiles/h100-mps.yaml"),
        include_str!("../profiles/h200-mig-timeslice.yaml"),
        include_str!("../profiles/homelab-timeslice.yaml"),
    ];

    /// Words the format is made of, spliced in by the mutator.
    const TOKENS: &[&str] = &[
        "version: v1\n",
        "rules:\n",
        "  - devices: all\n",
        "    mig: {1g.10gb: 7}\n",
        "    mig: {7g.80gb: 1, 1g.10gb: -1}\n",
        "    timeSlicing: {replicas: 0}\n",
        "    mps: {replicas: 48, activeThreadPercentage: 101, pinnedMemoryLimit: auto}\n",
        "    exclusive: true\n",
        "devices: {product: \"NVIDIA H100*\"}",
        "devices: [\"0-99999999999\"]",
        "devices: [\"7-0\"]",
        "migStrategy: single",
        "pinnedMemoryLimit: \"99999999999999999999G\"",
        "kind: ConfigMap\n",
        "data:\n  a: |\n",
        "---\n",
        "&a [*a]",
        "!!binary AAAA",
        "{",
        ": ",
        "\u{0}",
        "é",
    ];

    /// A ConfigMap holding every seed, as `kubectl create configmap --from-file` writes it.
    pub fn seed_configmap() -> String {
        let mut out = String::from(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: gpu-share-profiles, namespace: gpu-share}\ndata:\n",
        );
        for (i, seed) in SEEDS.iter().enumerate() {
            out.push_str(&format!("  p{i}: |\n"));
            for line in seed.lines() {
                out.push_str(&format!("    {line}\n"));
            }
        }
        out
    }

    #[derive(Debug, Clone)]
    enum Edit {
        Flip(usize, u8),
        Delete(usize, usize),
        Insert(usize, usize),
        Duplicate(usize, usize, usize),
        Truncate(usize),
    }

    fn edit() -> impl Strategy<Value = Edit> {
        prop_oneof![
            (any::<usize>(), any::<u8>()).prop_map(|(a, b)| Edit::Flip(a, b)),
            (any::<usize>(), 1usize..40).prop_map(|(a, n)| Edit::Delete(a, n)),
            (any::<usize>(), 0..TOKENS.len()).prop_map(|(a, t)| Edit::Insert(a, t)),
            (any::<usize>(), 1usize..80, any::<usize>())
                .prop_map(|(a, n, b)| Edit::Duplicate(a, n, b)),
            any::<usize>().prop_map(Edit::Truncate),
        ]
    }

    fn mutate(seed: &str, edits: &[Edit]) -> Vec<u8> {
        let mut b = seed.as_bytes().to_vec();
        for e in edits {
            let len = b.len().max(1);
            match *e {
                Edit::Flip(at, v) if !b.is_empty() => b[at % len] = v,
                Edit::Delete(at, n) if !b.is_empty() => {
                    let at = at % len;
                    let end = (at + n).min(b.len());
                    b.drain(at..end);
                }
                Edit::Insert(at, t) => {
                    let at = at % (b.len() + 1);
                    b.splice(at..at, TOKENS[t].bytes());
                }
                Edit::Duplicate(from, n, to) if !b.is_empty() => {
                    let from = from % len;
                    let chunk: Vec<u8> = b[from..(from + n).min(b.len())].to_vec();
                    let to = to % (b.len() + 1);
                    b.splice(to..to, chunk);
                }
                Edit::Truncate(at) => b.truncate(at % (b.len() + 1)),
                _ => {}
            }
        }
        b
    }

    /// What the fuzz targets do: parse, validate and (when valid) plan on 8 H100s; read a
    /// ConfigMap and validate every profile in it. Any panic fails the test, and so does a
    /// plan without the properties [`assert_plan_is_sound`] checks.
    pub fn exercise(bytes: &[u8]) {
        let text = String::from_utf8_lossy(bytes);
        if let Ok(profile) = parse_profile("fuzz", &text) {
            let problems = validate("fuzz", &profile);
            if problems.iter().all(|p| !p.is_error()) {
                let node = ObservedNode::simulated(&["h100x8".to_string()]);
                match plan("fuzz", &profile, &node) {
                    Ok(planned) => {
                        assert_plan_is_sound(&planned, &text);
                        assert_eq!(
                            plan("fuzz", &profile, &node).as_ref(),
                            Ok(&planned),
                            "planning twice gave two plans for:\n{text}"
                        );
                    }
                    Err(problems) => {
                        // A valid profile the node cannot hold: refused, saying why.
                        assert!(!problems.is_empty(), "refused without a reason:\n{text}");
                        assert!(
                            problems.iter().any(|p| p.is_error()),
                            "refused with warnings only: {problems:?}\n{text}"
                        );
                    }
                }
            }
        }
        for named in read_profiles("fuzz", &text) {
            if let Ok(profile) = named.profile {
                let _ = validate(&named.name, &profile);
            }
        }
    }

    /// What every plan for the simulated 8 × H100 node must be: each GPU planned once; every
    /// MIG instance of a profile the H100 has, at one of that profile's placements, none
    /// overlapping another; the node's resources the sum of its GPUs', none advertised as 0.
    fn assert_plan_is_sound(planned: &NodePlan, text: &str) {
        let indices: Vec<u32> = planned.gpus.iter().map(|g| g.index).collect();
        assert_eq!(indices, (0..8).collect::<Vec<_>>(), "GPUs planned:\n{text}");
        let h100 = gpu_share::mig::catalog()
            .model_by_product(&planned.gpus[0].product)
            .expect("the simulated H100 is in the catalog");
        let mut sum: BTreeMap<String, u64> = BTreeMap::new();
        for gpu in &planned.gpus {
            let mut taken: Vec<(u32, u32)> = Vec::new();
            for instance in gpu.geometry.iter().flat_map(|g| g.target()) {
                let profile = h100.profile(&instance.profile).unwrap_or_else(|| {
                    panic!(
                        "GPU {}: no {} on an H100:\n{text}",
                        gpu.index, instance.profile
                    )
                });
                let at = instance.placement;
                assert!(
                    profile.placements.contains(&at),
                    "GPU {}: {} at {at:?} is not one of its placements:\n{text}",
                    gpu.index,
                    instance.profile
                );
                let (start, end) = (at.start, at.start + at.size);
                assert!(
                    taken.iter().all(|&(s, e)| end <= s || e <= start),
                    "GPU {}: {} at {at:?} overlaps another instance:\n{text}",
                    gpu.index,
                    instance.profile
                );
                taken.push((start, end));
            }
            for (name, n) in &gpu.resources {
                *sum.entry(name.clone()).or_insert(0) += n;
            }
        }
        assert_eq!(
            planned.resources, sum,
            "node resources vs its GPUs':\n{text}"
        );
        assert!(
            planned.resources.values().all(|&n| n > 0),
            "a resource advertised as 0: {:?}\n{text}",
            planned.resources
        );
    }

    /// `cases` mutated inputs, drawn from `seed`: the same seed, the same inputs.
    fn run(cases: u32, seed: u64) {
        let seeds: Vec<String> = SEEDS
            .iter()
            .map(|s| s.to_string())
            .chain([seed_configmap()])
            .collect();
        let config = ProptestConfig {
            cases,
            failure_persistence: None,
            rng_seed: RngSeed::Fixed(seed),
            ..ProptestConfig::default()
        };
        proptest!(config, |(seed in 0..seeds.len(), edits in proptest::collection::vec(edit(), 1..8))| {
            exercise(&mutate(&seeds[seed], &edits));
        });
    }

    #[test]
    fn the_parser_and_configmap_reader_survive_mutated_inputs() {
        for seed in SEEDS
            .iter()
            .map(|s| s.to_string())
            .chain([seed_configmap()])
        {
            exercise(seed.as_bytes());
        }
        // The run CI makes: 10k inputs (under a second here) from a printed seed. The guard is
        // no time box: a run past it fails, saying so.
        let seed = test_seed("mutated inputs");
        let started = Instant::now();
        run(10_000, seed);
        let took = started.elapsed();
        eprintln!(
            "seed {seed}: 10000 mutated inputs in {:.1}s",
            took.as_secs_f64()
        );
        assert!(
            took < Duration::from_secs(300),
            "seed {seed}: 10000 inputs took {took:?}"
        );
    }

    #[test]
    fn a_huge_device_range_is_refused_without_being_expanded() {
        // Found by `cargo fuzz run profile_parser`: `devices: ["0- 01595693596"]` allocated
        // 6 GiB (and "0-4294967295" 16 GiB) before validation could say anything.
        let text = "version: v1\nrules:\n  - devices: [\"0-4294967295\"]\n    exclusive: true\n";
        let err = parse_profile("huge", text).unwrap_err();
        assert!(err.message.contains("spans more than 1024 GPUs"), "{err}");
        let many = format!(
            "version: v1\nrules:\n  - devices: [{}]\n    exclusive: true\n",
            ["\"0-1000\""; 2].join(", ")
        );
        let err = parse_profile("many", &many).unwrap_err();
        assert!(err.message.contains("more than 1024 GPU indices"), "{err}");
        let fine = "version: v1\nrules:\n  - devices: [\"0-7\", 8]\n    exclusive: true\n";
        assert!(parse_profile("fine", fine).is_ok());
    }

    #[test]
    #[ignore = "opt-in, a minute or two: cargo test --test reliability -- --ignored"]
    fn the_parser_and_configmap_reader_survive_a_million_mutated_inputs() {
        run(1_000_000, test_seed("a million mutated inputs"));
    }
}

// -------------------------------------------------------------------------------------------
// Requests that hang or fail around a drain, and the cordon they must not leave behind. (These
// began as `known_issue_*` tests, ignored while they failed.)
// -------------------------------------------------------------------------------------------

/// A node draining balanced → inference whose budget is lifted right after `count` × `fault`
/// are armed. API requests time out after 2 s.
fn drain_with_fault(
    name: &str,
    verb: Verb,
    resource: &str,
    count: usize,
    fault: Fault,
) -> (Arc<KubeDouble>, AgentNode) {
    let api = Arc::new(KubeDouble::start());
    let node = balanced_node_with_pods(
        &api,
        name,
        &["--drain-timeout", "5s", "--api-timeout", "2s"],
        &[],
    );
    guard(&api, "moves", "moves");
    drain_for_inference(&api, &node);
    api.fail_next(verb, resource, count, fault);
    api.remove::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(Some("default"), "moves");
    (api, node)
}

#[test]
fn a_hung_eviction_request_is_bounded_by_the_drain_timeout() {
    let (api, node) = drain_with_fault(
        "gpu-hang-evict",
        Verb::Create,
        "pods/eviction",
        1,
        Fault::Hang,
    );
    // --drain-timeout 5s: by 20 s the drain has either finished or given up.
    let settled = api.wait_until(Duration::from_secs(20), |a| {
        matches!(
            state_of(a, &node.name).as_deref(),
            Some("success" | "failed")
        )
    });
    assert!(
        settled,
        "still {:?} 20 s after a 5 s drain timeout: {:?}",
        state_of(&api, &node.name),
        annotation(&api, &node.name, REASON)
    );
    assert_no_orphans(&node.nvml(), &node.name);
}

#[test]
fn a_hung_node_patch_times_out_is_reported_and_retried() {
    // --api-timeout 2s: the hung patch (the `applying` state) fails after 2 s.
    let (api, node) = drain_with_fault("gpu-hang-patch", Verb::Patch, "nodes", 1, Fault::Hang);
    let applied = api.wait_until(Duration::from_secs(30), |a| {
        is_applied(a, &node.name, &profile_text("h100-inference"))
    });
    assert!(
        applied,
        "state {:?}, {} GPU instances destroyed\n{}",
        state_of(&api, &node.name),
        node.count("nvmlGpuInstanceDestroy"),
        node.log()
    );
    let hung = api
        .requests()
        .into_iter()
        .filter(|r| r.resource == "nodes" && r.injected)
        .count();
    assert_eq!(hung, 1, "the hang was hit");
    // Reported like any other API error (a Warning Event, the reconcile failed and retried),
    // not swallowed.
    let reported = api.wait_until(Duration::from_secs(30), |a| {
        a.events().into_iter().any(|e| {
            e.reason.as_deref() == Some("ApiError")
                && e.note.as_deref().is_some_and(|n| {
                    n.contains("could not publish state applying") && n.contains("timed out")
                })
        })
    });
    assert!(
        reported,
        "no ApiError event for the hung patch: {:?}",
        api.events()
            .iter()
            .map(|e| (e.reason.clone(), e.note.clone()))
            .collect::<Vec<_>>()
    );
    // The retry that follows the failure publishes the applied profile again.
    wait_applied(&api, &node, "h100-inference", Duration::from_secs(30));
    assert!(
        !unschedulable(&api, &node.name),
        "uncordoned after the change"
    );
    assert_promises(&api, &node, "h100-inference", &["moves"], &["stays", "web"]);
}

#[test]
fn an_uncordon_lost_to_api_errors_is_retried_by_the_next_reconcile() {
    // Four 500s on Node patches: the `applying` state, the uncordon, the `failed` state (no
    // `success` is published while a write of the pass is lost) and the uncordon after that
    // failure. Only the retry (backoff 5 s) can lift the cordon.
    let (api, node) = drain_with_fault("gpu-uncordon", Verb::Patch, "nodes", 4, Fault::Status(500));
    wait_applied(&api, &node, "h100-inference", Duration::from_secs(30));
    let injected = api
        .requests()
        .into_iter()
        .filter(|r| r.resource == "nodes" && r.injected)
        .count();
    assert_eq!(injected, 4, "every injected 500 was hit");
    // `success` comes only from a pass whose uncordon went through: no waiting here.
    assert!(
        !unschedulable(&api, &node.name),
        "state success but the node stays cordoned: {:?}\n{}",
        annotation(&api, &node.name, CORDONED),
        node.log()
    );
    assert!(annotation(&api, &node.name, CORDONED).is_none());
    assert_promises(&api, &node, "h100-inference", &["moves"], &["stays", "web"]);
}

#[test]
fn a_cordon_made_by_someone_else_is_left_alone() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api, &["homelab-timeslice"], &[]);
    let mut node = AgentNode::new(&api, "gpu-admin-cordon", h100s(1, false));
    // An administrator cordoned the node; a profile without MIG change needs no cordon.
    api.modify::<k8s_openapi::api::core::v1::Node>(None, &node.name, |n| {
        n.spec.get_or_insert_with(Default::default).unschedulable = Some(true);
    });
    node.start_agent(&[], &[]); // --resync-period 2s
    api.set_node_label(&node.name, PROFILE_LABEL, Some("homelab-timeslice"));
    wait_applied(&api, &node, "homelab-timeslice", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(2500)); // a resync
    assert!(unschedulable(&api, &node.name), "the admin's cordon stays");
    assert!(annotation(&api, &node.name, CORDONED).is_none());
}
