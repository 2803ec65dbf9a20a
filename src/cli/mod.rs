//! The `gpu-share` command line. Each subcommand reads its inputs, calls the pure core and
//! prints the result as text for people or JSON/YAML for scripts.

#[cfg(test)]
mod command_tree;
mod logging;
mod render;
mod setup;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;

use crate::advise;
use crate::agent::advertisement::{verdicts, Advertisement, DeviceVerdict};
use crate::agent::AgentArgs;
use crate::apply::{apply, resume, ApplyError, ApplyOptions, DevicePluginOutput};
use crate::gpu::Gpus;
use crate::mig::catalog;
use crate::mps::daemon::{self, MpsSettings};
use crate::nvidia_plugin::SignalTarget;
use crate::plan::{plan_for, ObservedNode};
use crate::profile::{
    check_size, read_profiles, NamedProfile, Problem, Profile, MAX_PROFILE_BYTES,
};
use crate::sharing::PluginKind;
use crate::validate::validate_for;

/// Share NVIDIA GPUs in Kubernetes: MIG geometry, MPS and time-slicing from one profile.
#[derive(Parser, Debug)]
#[command(name = "gpu-share", version, about)]
pub struct Cli {
    /// Log format on stderr (level from RUST_LOG, default info).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Check profile files or ConfigMaps; exit 1 if any has an error.
    Validate(ValidateArgs),
    /// Show what a profile would change on a node (simulated or observed) and what it advertises.
    Plan(PlanArgs),
    /// Propose a profile per node that serves the pods' GPU demand (demand and supply files, or
    /// --live from the cluster), with what it would change; docs/advise.md.
    Advise(AdviseArgs),
    /// Run advise on the live cluster on every change and apply it through profile keys and
    /// node labels, within the drain budget and PDBs (a Deployment); docs/autopilot.md.
    Autopilot(Box<crate::autopilot::AutopilotArgs>),
    /// Print the profile format's JSON Schema (`--of demand|supply`: advise's input files).
    Schema(SchemaArgs),
    /// List the MIG-capable GPU models and their profiles.
    Catalog(OutputArgs),
    /// Make this node's GPUs match a profile (MIG mode, GPU and compute instances).
    Apply(ApplyArgs),
    /// Show the GPUs: MIG mode, instances and placements, MIG device UUIDs, processes.
    Status(StatusArgs),
    /// Run the node agent (a DaemonSet pod): label → profile → safe reconfiguration.
    Agent(Box<AgentArgs>),
    /// Check the GPU stack bottom-up (driver, NVML, profile needs, container runtime, device
    /// plugin, CUDA) and stop at the first broken layer with what to fix.
    #[command(after_help = crate::doctor::EXIT_CODES)]
    Doctor(DoctorArgs),
    /// MPS on this node, set-up steps outside the agent.
    #[command(subcommand)]
    Mps(setup::MpsCommand),
    /// The NVIDIA device plugin's config file, set-up steps outside the agent.
    #[command(subcommand)]
    DevicePlugin(setup::DevicePluginCommand),
}

#[derive(Args, Debug)]
struct DoctorArgs {
    #[command(flatten)]
    checks: crate::doctor::DoctorOptions,
    #[command(flatten)]
    nvml: NvmlArgs,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Args, Debug)]
struct NvmlArgs {
    /// The NVML library to load (default: the system's libnvidia-ml.so.1).
    #[arg(long, env = "GPU_SHARE_NVML_LIB")]
    nvml_lib: Option<PathBuf>,
}

/// How a command on the node reaches its GPUs: NVML, or on a Jetson/Tegra without NVML the
/// files under the host's root (the agent's `--host-root`).
#[derive(Args, Debug)]
struct NodeGpuArgs {
    #[command(flatten)]
    nvml: NvmlArgs,
    /// The host's root: where a Jetson/Tegra's files (etc/nv_tegra_release,
    /// sys/devices/soc0/family, the device tree) are read when NVML does not load.
    #[arg(
        long,
        env = "GPU_SHARE_HOST_ROOT",
        value_name = "DIR",
        default_value = "/"
    )]
    host_root: PathBuf,
}

impl NodeGpuArgs {
    fn open(&self) -> Result<Gpus, crate::gpu::GpuError> {
        Gpus::open_node(self.nvml.nvml_lib.as_deref(), &self.host_root)
    }
}

#[derive(Args, Debug)]
struct ApplyArgs {
    /// The profile: a profile file, or a ConfigMap file (then pick the key with --key).
    /// Required unless --resume rolls an interrupted apply forward.
    #[arg(long, required_unless_present = "resume")]
    profile: Option<PathBuf>,
    /// Which ConfigMap key of --profile, when it holds more than one.
    #[arg(long, requires = "profile")]
    key: Option<String>,
    /// Roll an interrupted apply forward to the profile its journal names.
    #[arg(long, conflicts_with = "profile")]
    resume: bool,
    /// Where the crash-safety journal is kept.
    #[arg(
        long,
        env = "GPU_SHARE_STATE_DIR",
        default_value = "/var/lib/gpu-share"
    )]
    state_dir: PathBuf,
    /// Change instances even when processes run on them (the driver may still refuse).
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    plugin: PluginArgs,
    #[command(flatten)]
    plugin_kind: PluginKindArgs,
    #[command(flatten)]
    mps: MpsArgs,
    #[command(flatten)]
    nvml: NodeGpuArgs,
    #[command(flatten)]
    out: OutputArgs,
}

/// Where MPS control daemons run from.
#[derive(Args, Debug)]
struct MpsArgs {
    /// The MPS control binary.
    #[arg(long, env = "GPU_SHARE_MPS_CONTROL", default_value = daemon::DEFAULT_CONTROL_BINARY)]
    mps_control: PathBuf,
    /// Root of the MPS pipe and log directories (shared with the device plugin).
    #[arg(long, env = "GPU_SHARE_MPS_ROOT", default_value = daemon::DEFAULT_ROOT)]
    mps_root: PathBuf,
}

impl MpsArgs {
    fn settings(&self) -> MpsSettings {
        MpsSettings {
            control_binary: self.mps_control.clone(),
            root: self.mps_root.clone(),
            ..MpsSettings::default()
        }
    }
}

/// The NVIDIA device plugin's config file and how to make it reload.
#[derive(Args, Debug)]
struct PluginArgs {
    /// The device plugin's config file (its CONFIG_FILE). `apply` writes it when it changes;
    /// `plan` shows the difference.
    #[arg(long, env = "GPU_SHARE_PLUGIN_CONFIG")]
    plugin_config: Option<PathBuf>,
    /// Send SIGHUP to the PID in this file after writing the config.
    #[arg(
        long,
        env = "GPU_SHARE_PLUGIN_PID_FILE",
        conflicts_with = "plugin_process"
    )]
    plugin_pid_file: Option<PathBuf>,
    /// Send SIGHUP to the process with this argv[0] (needs a shared process namespace),
    /// e.g. nvidia-device-plugin.
    #[arg(long, env = "GPU_SHARE_PLUGIN_PROCESS")]
    plugin_process: Option<String>,
    /// Where to look for --plugin-process.
    #[arg(long, default_value = "/proc", hide = true)]
    proc_root: PathBuf,
}

impl PluginArgs {
    fn output(&self) -> Option<DevicePluginOutput> {
        let reload = match (&self.plugin_pid_file, &self.plugin_process) {
            (Some(file), _) => Some(SignalTarget::PidFile(file.clone())),
            (None, Some(name)) => Some(SignalTarget::ProcessName {
                name: name.clone(),
                proc_root: self.proc_root.clone(),
                pod_uid: None,
            }),
            (None, None) => None,
        };
        self.plugin_config.as_ref().map(|path| DevicePluginOutput {
            config_path: path.clone(),
            reload,
        })
    }
}

/// Which device plugin advertises the node's GPUs.
#[derive(Args, Debug)]
struct PluginKindArgs {
    /// The device plugin the profile is checked for: `nvidia` (the stock k8s-device-plugin;
    /// what it cannot express is refused), `builtin` (gpu-share's agent serves the kubelet
    /// itself) or `dra` (ResourceSlices; only the agent applies it, so `apply` refuses it).
    #[arg(long, env = "GPU_SHARE_PLUGIN", value_enum, default_value_t = PluginKind::Nvidia)]
    plugin: PluginKind,
}

#[derive(Args, Debug)]
struct StatusArgs {
    #[command(flatten)]
    nvml: NodeGpuArgs,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Args, Debug)]
struct OutputArgs {
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = Output::Text)]
    output: Output,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    Text,
    Json,
    Yaml,
}

#[derive(Args, Debug)]
struct ValidateArgs {
    /// Profile files, or YAML files holding ConfigMaps whose data keys are profiles.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The device plugin to check for: `nvidia` refuses what the stock plugin cannot express;
    /// `builtin` checks the built-in plugin's rules instead; `dra` the DRA driver's (the only
    /// one that takes `dynamicMig`).
    #[arg(long, value_enum, default_value_t = PluginKind::Nvidia)]
    plugin: PluginKind,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Args, Debug)]
struct PlanArgs {
    /// The profile: a profile file, or a ConfigMap file (then pick the key with --key).
    #[arg(long)]
    profile: PathBuf,
    /// Which ConfigMap key to plan, when the file holds more than one profile.
    #[arg(long)]
    key: Option<String>,
    /// Simulated GPUs, MODEL[xN] (N from 1 to 16, at most 16 GPUs in all): a catalog model
    /// (`h100x4`, `a100-40gb`, `NVIDIA H200`; `gpu-share catalog` lists them), or the product
    /// name of a GPU without MIG as NVML reports it (`"NVIDIA GeForce RTX 3090x2"`). A name not
    /// in the catalog is taken as a GPU without MIG, except a short one a typo away from a
    /// catalog model (`h10`), which is refused with the model it may mean. Repeat for mixed
    /// nodes. With neither --gpu nor --current, the plan is for this node's own GPUs, read
    /// through NVML (read-only: nothing is changed).
    #[arg(long, conflicts_with = "current")]
    gpu: Vec<String>,
    /// An observed node state (YAML or JSON, as `gpu-share status --output json` prints it).
    #[arg(long)]
    current: Option<PathBuf>,
    /// Without --gpu or --current: how this node's GPUs are read.
    #[command(flatten)]
    nvml: NodeGpuArgs,
    /// The device plugin's current config file, to show what would change in it.
    #[arg(long, env = "GPU_SHARE_PLUGIN_CONFIG")]
    plugin_config: Option<PathBuf>,
    /// The device plugin to plan for (`builtin`: no NVIDIA config, none of its refusals;
    /// `dra`: the ResourceSlices the node would publish instead).
    #[arg(long, value_enum, default_value_t = PluginKind::Nvidia)]
    plugin: PluginKind,
    /// dra: the node's name, which names its pool and slices.
    #[arg(long, env = "NODE_NAME", default_value = "node")]
    node_name: String,
    /// dra, planning this node's own GPUs: the DRA plugin's directory (the agent's), whose
    /// dynamic-MIG journal says which MIG instances claims made; the plan then publishes those
    /// as the agent does, and only the others count as made out of band. With --gpu or
    /// --current every instance on a dynamic GPU counts as out of band.
    #[arg(long, env = "GPU_SHARE_DRA_PLUGIN_DIR",
          default_value = crate::dra::kubelet_plugin::DEFAULT_PLUGIN_DIR)]
    dra_plugin_dir: PathBuf,
    /// The node's last applied advertisement (the agent's `<state dir>/advertised.json`): the
    /// plan then says, per device ID a pod may hold now, whether that pod stays or is evicted
    /// first, and why (a device advertised otherwise is re-allocated; docs/operator-guide.md).
    /// Needs --current or this node's GPUs (UUIDs), not --gpu; not with --plugin dra.
    #[arg(long, conflicts_with = "gpu")]
    advertised: Option<PathBuf>,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Args, Debug)]
struct AdviseArgs {
    /// The pods and their GPU requests (YAML or JSON; `gpu-share schema --of demand`).
    #[arg(long, required_unless_present = "live")]
    demand: Option<PathBuf>,
    /// The GPU nodes and how they are shared now (YAML or JSON; `gpu-share schema --of supply`).
    #[arg(long, required_unless_present = "live")]
    supply: Option<PathBuf>,
    /// Read demand and supply from the cluster (KUBECONFIG or in-cluster): Pods, Nodes with
    /// GPU Feature Discovery labels, and the profiles ConfigMap.
    #[arg(long, alias = "from-cluster", conflicts_with_all = ["demand", "supply"])]
    live: bool,
    /// With --live: where the profiles are read.
    #[command(flatten)]
    profiles: crate::profile::ProfilesSource,
    /// The device plugin the nodes run: `nvidia` shares all whole GPUs of a node one way.
    #[arg(long, value_enum, default_value_t = PluginKind::Nvidia)]
    plugin: PluginKind,
    /// `configmap`: a ConfigMap manifest with the proposed profiles and the label commands.
    #[arg(long, short, value_enum, default_value_t = AdviseOutput::Text)]
    output: AdviseOutput,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum AdviseOutput {
    Text,
    Json,
    Yaml,
    Configmap,
}

#[derive(Args, Debug)]
struct SchemaArgs {
    /// Which format.
    #[arg(long, value_enum, default_value_t = SchemaOf::Profile)]
    of: SchemaOf,
    /// The schema as JSON (the default, what editors read) or YAML.
    #[arg(long, short, value_enum, default_value_t = SchemaOutput::Json)]
    output: SchemaOutput,
}

/// A schema has no text form: JSON or YAML.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum SchemaOutput {
    Json,
    Yaml,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum SchemaOf {
    Profile,
    Demand,
    Supply,
}

/// `plan --plugin dra`: the plan and the slices that would publish it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DraPlan {
    #[serde(flatten)]
    plan: crate::plan::NodePlan,
    resource_slices: Vec<crate::dra::api::ResourceSlice>,
}

/// `plan --advertised`: the plan and, per device ID advertised now, what becomes of its holder.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReallocationPlan {
    #[serde(flatten)]
    plan: crate::plan::NodePlan,
    reallocation: Vec<DeviceVerdict>,
}

/// Parse the command line and run; the exit code says whether problems were found.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", render::error_chain(&e));
            ExitCode::from(2)
        }
    }
}

fn dispatch(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Validate(args) => run_validate(&args),
        Command::Plan(args) => run_plan(&args),
        Command::Advise(args) => run_advise(&args),
        Command::Schema(args) => {
            let schema = match args.of {
                SchemaOf::Profile => schemars::schema_for!(Profile),
                SchemaOf::Demand => schemars::schema_for!(advise::Demand),
                SchemaOf::Supply => schemars::schema_for!(advise::Supply),
            };
            match args.output {
                SchemaOutput::Json => println!("{}", serde_json::to_string_pretty(&schema)?),
                SchemaOutput::Yaml => print!("{}", serde_yaml::to_string(&schema)?),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Catalog(out) => {
            emit(out.output, &catalog().models, render::catalog)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Apply(args) => run_apply(&args),
        Command::Agent(args) => {
            crate::agent::runtime()?.block_on(crate::agent::run(*args))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Autopilot(args) => {
            crate::agent::runtime()?.block_on(crate::autopilot::run(*args))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Status(args) => {
            let gpus = args.nvml.open()?;
            let node = gpus.observe()?;
            emit(args.out.output, &node, render::status)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Doctor(args) => {
            let c = &args.checks;
            let profile = (c.profile.as_deref())
                .map(|p| pick_profile(p, c.key.as_deref()))
                .transpose()?;
            let report = crate::doctor::run(c, args.nvml.nvml_lib.as_deref(), profile.as_ref());
            emit(args.out.output, &report, crate::doctor::render_text)?;
            Ok(ExitCode::from(report.exit_code()))
        }
        Command::DevicePlugin(command) => setup::device_plugin(&command),
        Command::Mps(command) => setup::mps(&command),
    }
}

/// Exit code when a MIG mode change waits for a GPU reset.
const EXIT_RESET_REQUIRED: u8 = 3;

fn run_apply(args: &ApplyArgs) -> Result<ExitCode> {
    if args.plugin_kind.plugin == PluginKind::Dra {
        bail!("{}", crate::dra::APPLY_NEEDS_AGENT);
    }
    let gpus = args.nvml.open()?;
    let opts = ApplyOptions {
        state_dir: args.state_dir.clone(),
        force: args.force,
        device_plugin: args.plugin.output(),
        mps: args.mps.settings(),
        plugin: args.plugin_kind.plugin,
    };
    let result = match &args.profile {
        Some(path) => {
            let named = pick_profile(path, args.key.as_deref())?;
            match named.profile {
                Ok(profile) => apply(&gpus, &named.name, &profile, &opts),
                Err(problem) => return report_problems(args.out.output, &[problem]),
            }
        }
        None => resume(&gpus, &opts),
    };
    match result {
        Ok(report) => {
            emit(args.out.output, &report, render::applied)?;
            Ok(if report.reset_required.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_RESET_REQUIRED)
            })
        }
        Err(ApplyError::Invalid(problems)) => report_problems(args.out.output, &problems),
        Err(e @ ApplyError::Busy(_)) => {
            eprintln!("error: {e}");
            Ok(ExitCode::FAILURE)
        }
        Err(e) => Err(e.into()),
    }
}

/// One profile's validation result.
#[derive(Serialize)]
struct Checked {
    file: String,
    profile: String,
    valid: bool,
    problems: Vec<Problem>,
}

fn run_validate(args: &ValidateArgs) -> Result<ExitCode> {
    let mut results = Vec::new();
    for file in &args.files {
        for named in read_file(file)? {
            let problems = match &named.profile {
                Ok(profile) => validate_for(&named.name, profile, args.plugin),
                Err(problem) => vec![problem.clone()],
            };
            results.push(Checked {
                file: file.display().to_string(),
                valid: !problems.iter().any(Problem::is_error),
                profile: named.name,
                problems,
            });
        }
    }
    emit(args.out.output, &results, |r| render::validation(r))?;
    let ok = results.iter().all(|r| r.valid);
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn run_plan(args: &PlanArgs) -> Result<ExitCode> {
    let named = pick_profile(&args.profile, args.key.as_deref())?;
    let profile = match named.profile {
        Ok(p) => p,
        Err(problem) => return report_problems(args.out.output, &[problem]),
    };
    let this_node = args.current.is_none() && args.gpu.is_empty();
    let (node, simulated) = match &args.current {
        Some(path) => (read_observed(path)?, false),
        None if this_node => (observe_this_node(&args.nvml)?, false),
        None => (
            ObservedNode::from_gpu_specs(&args.gpu).map_err(anyhow::Error::msg)?,
            true,
        ),
    };
    match plan_for(&named.name, &profile, &node, args.plugin) {
        Ok(plan) if args.plugin == PluginKind::Dra => {
            let claimed = if this_node {
                claims_instances(&args.dra_plugin_dir)?
            } else {
                Default::default()
            };
            // Generation 1: a plan is what a first publication would be.
            let resource_slices =
                crate::dra::resource_slices_with(&args.node_name, 1, &plan.gpus, &node, &claimed);
            let dra = DraPlan {
                plan,
                resource_slices,
            };
            emit(args.out.output, &dra, |d| {
                render::plan(&d.plan, simulated) + &render::resource_slices(&d.resource_slices)
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Ok(plan) => {
            let current = args
                .plugin_config
                .as_ref()
                .map(|path| (path.clone(), std::fs::read_to_string(path).ok()));
            let text = |p: &crate::plan::NodePlan| {
                render::plan(p, simulated) + &render::plugin_config(p, current.as_ref())
            };
            match &args.advertised {
                Some(path) => {
                    let reallocation = plan_verdicts(path, &plan, &node, &profile.plugin)?;
                    let both = ReallocationPlan { plan, reallocation };
                    emit(args.out.output, &both, |b| {
                        text(&b.plan) + &render::reallocation(path, &b.reallocation)
                    })?;
                }
                None => emit(args.out.output, &plan, text)?,
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(problems) => report_problems(args.out.output, &problems),
    }
}

/// `plan --advertised`: each device ID of the saved advertisement judged against what `plan`
/// advertises on `node` (the agent's rule, `agent::advertisement`).
/// The MIG instances claims made on this node's dynamic GPUs, from the journal in the DRA
/// plugin's directory (none when there is no journal: no claim made one).
fn claims_instances(plugin_dir: &Path) -> Result<crate::dra::dynamic::ClaimedInstances> {
    let path = plugin_dir.join(crate::dra::kubelet_plugin::mig_journal::FILE);
    let journal = crate::dra::kubelet_plugin::mig_journal::MigJournal::load(&path)
        .map_err(anyhow::Error::msg)?;
    Ok(journal.claimed())
}

fn plan_verdicts(
    path: &Path,
    plan: &crate::plan::NodePlan,
    node: &ObservedNode,
    options: &crate::profile::PluginOptions,
) -> Result<Vec<DeviceVerdict>> {
    let text = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let before: Advertisement = serde_json::from_slice(&text).with_context(|| {
        format!(
            "{}: not an advertisement as the agent saves it ({})",
            path.display(),
            crate::agent::advertisement::ADVERTISEMENT_FILE
        )
    })?;
    let root = Path::new(daemon::DEFAULT_ROOT);
    let inventory =
        crate::builtin_plugin::inventory::Inventory::from_plan(plan, node, options, root);
    Ok(verdicts(&before, &Advertisement::of(&inventory)))
}

/// `plan` with neither `--gpu` nor `--current`: the GPUs of the node it runs on, read through
/// NVML as `status` reads them (nothing is changed). A node without a driver gets the two ways
/// to plan without one, rather than only NVML's load error.
fn observe_this_node(gpus: &NodeGpuArgs) -> Result<ObservedNode> {
    let observed = gpus.open().and_then(|gpus| gpus.observe());
    observed.map_err(|e| {
        anyhow::Error::new(e).context(
            "plan reads this node's GPUs when neither --gpu nor --current is given, and cannot: \
             plan for simulated GPUs with --gpu MODEL[xN] (e.g. --gpu h100x8; `gpu-share catalog` \
             lists the models) or for an observed node with --current FILE \
             (`gpu-share status -o json` on that node)",
        )
    })
}

/// Exit 0 when every pod is served, 1 when some are unschedulable or the input is refused.
fn run_advise(args: &AdviseArgs) -> Result<ExitCode> {
    fn read<T: serde::de::DeserializeOwned>(what: &str, path: &Path) -> Result<T> {
        let text = advise::read_input(what, path)?;
        advise::parse(what, &text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }
    let (demand, supply) = match (&args.demand, &args.supply) {
        (Some(demand), Some(supply)) if !args.live => {
            (read("demand", demand)?, read("supply", supply)?)
        }
        _ => read_live(args)?,
    };
    let advice = match advise::advise(&demand, &supply, args.plugin) {
        Ok(a) => a,
        Err(errors) => {
            for e in errors {
                eprintln!("error: {e}");
            }
            return Ok(ExitCode::FAILURE);
        }
    };
    let output = match args.output {
        AdviseOutput::Text => Output::Text,
        AdviseOutput::Json => Output::Json,
        AdviseOutput::Yaml => Output::Yaml,
        AdviseOutput::Configmap => {
            let text = advise::render::configmap(&advice)?;
            std::io::stdout().lock().write_all(text.as_bytes())?;
            return Ok(advise_exit(&advice));
        }
    };
    emit(output, &advice, advise::render::text)?;
    Ok(advise_exit(&advice))
}

/// `advise --live`: demand and supply from the API server; nodes left out are warned about.
fn read_live(args: &AdviseArgs) -> Result<(advise::Demand, advise::Supply)> {
    let cluster = crate::agent::runtime()?.block_on(async {
        let client = kube::Client::try_default()
            .await
            .context("cannot find the Kubernetes API (in-cluster config or KUBECONFIG)")?;
        advise::live::read_cluster(
            &client,
            &args.profiles.namespace,
            &args.profiles.configmap,
            None,
        )
        .await
        .context("cannot read the cluster")
    })?;
    let input = advise::live::from_cluster(&cluster, args.plugin);
    for skipped in &input.skipped {
        eprintln!("warning: {skipped}; left out of the supply");
    }
    for stale in &input.stale_devices {
        eprintln!("warning: {stale}");
    }
    Ok((input.demand, input.supply))
}

fn advise_exit(advice: &advise::Advice) -> ExitCode {
    let planned = advice.nodes.iter().all(|n| n.problems.is_empty());
    if advice.unschedulable.is_empty() && planned {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn report_problems(output: Output, problems: &[Problem]) -> Result<ExitCode> {
    emit(output, &problems, |ps| {
        ps.iter().map(|p| format!("{p}\n")).collect::<String>()
    })?;
    Ok(ExitCode::FAILURE)
}

/// The profiles in a file. At most [`MAX_PROFILE_BYTES`] + 1 bytes are read: a larger file is
/// refused without reading the rest.
fn read_file(path: &Path) -> Result<Vec<NamedProfile>> {
    use std::io::Read;
    let stem = path
        .file_stem()
        .map_or_else(|| "profile".into(), |s| s.to_string_lossy().into_owned());
    let cannot_read = || format!("cannot read {}", path.display());
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_PROFILE_BYTES as u64 + 1).read_to_end(&mut bytes))
        .with_context(cannot_read)?;
    if let Err(problem) = check_size(&stem, "file", bytes.len()) {
        return Ok(vec![NamedProfile {
            name: stem,
            profile: Err(problem),
        }]);
    }
    let text = String::from_utf8(bytes).with_context(cannot_read)?;
    Ok(read_profiles(&stem, &text))
}

fn pick_profile(path: &Path, key: Option<&str>) -> Result<NamedProfile> {
    let mut all = read_file(path)?;
    match key {
        Some(k) => match all.iter().position(|p| p.name == k) {
            Some(i) => Ok(all.swap_remove(i)),
            None => bail!(
                "{} has no profile {k:?}; it has {}",
                path.display(),
                names(&all)
            ),
        },
        None if all.len() == 1 => Ok(all.remove(0)),
        None => bail!(
            "{} holds {} profiles ({}): pick one with --key",
            path.display(),
            all.len(),
            names(&all)
        ),
    }
}

fn names(all: &[NamedProfile]) -> String {
    all.iter()
        .map(|p| p.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn read_observed(path: &Path) -> Result<ObservedNode> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_yaml::from_str(&text)
        .with_context(|| format!("{} is not an observed node state", path.display()))
}

/// Print `value` as JSON or YAML, or as text through `text`.
fn emit<T: Serialize + ?Sized>(
    output: Output,
    value: &T,
    text: impl Fn(&T) -> String,
) -> Result<()> {
    let rendered = match output {
        Output::Text => text(value),
        Output::Json => serde_json::to_string_pretty(value)? + "\n",
        Output::Yaml => serde_yaml::to_string(value)?,
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(rendered.as_bytes())?;
    stdout.flush()?;
    Ok(())
}

/// `gpu-share plan ... | head` is not an error.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}
