//! The set-up steps outside the agent, each an init container's command: `device-plugin
//! init-config` (an empty config so NVIDIA's plugin starts) and `mps mount-shm` (the tmpfs MPS
//! servers and clients share as /dev/shm).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Subcommand};
use serde::Serialize;

use super::{emit, OutputArgs};
use crate::mps::daemon;

#[derive(Subcommand, Debug)]
pub(super) enum DevicePluginCommand {
    /// Create an empty config (the plugin's defaults: whole GPUs, no sharing) unless the file
    /// exists: the plugin exits without one, and the agent writes one only once a profile
    /// applies. An init container runs it before the plugin starts.
    InitConfig(InitConfigArgs),
}

#[derive(Args, Debug)]
pub(super) struct InitConfigArgs {
    /// The config file the plugin reads (its CONFIG_FILE) and the agent writes.
    #[arg(long, env = "GPU_SHARE_PLUGIN_CONFIG")]
    pub(super) plugin_config: PathBuf,
    #[command(flatten)]
    out: OutputArgs,
}

/// What `device-plugin init-config` did, for `-o json|yaml`.
#[derive(Serialize)]
struct InitConfigOutcome<'a> {
    path: &'a Path,
    created: bool,
}

#[derive(Subcommand, Debug)]
pub(super) enum MpsCommand {
    /// Mount the tmpfs that MPS servers and clients share as /dev/shm at <root>/shm (NVIDIA's
    /// options, half the node's memory); nothing to do when it is a mount point already. Needs
    /// CAP_SYS_ADMIN: a privileged init container, its MPS root mounted with
    /// mountPropagation Bidirectional.
    MountShm(MountShmArgs),
}

#[derive(Args, Debug)]
pub(super) struct MountShmArgs {
    /// The MPS root (the agent's --mps-root): the tmpfs goes at <root>/shm.
    #[arg(long, env = "GPU_SHARE_MPS_ROOT", default_value = daemon::DEFAULT_ROOT, alias = "root")]
    pub(super) mps_root: PathBuf,
    /// Where /proc is: meminfo sizes the tmpfs, self/mountinfo tells whether it is mounted.
    #[arg(long, default_value = "/proc")]
    pub(super) proc_root: PathBuf,
    #[command(flatten)]
    out: OutputArgs,
}

/// `device-plugin init-config`: create the empty config unless it exists, say which.
pub(super) fn device_plugin(command: &DevicePluginCommand) -> Result<ExitCode> {
    let DevicePluginCommand::InitConfig(args) = command;
    let path = &args.plugin_config;
    match crate::nvidia_plugin::create_empty_unless_present(path) {
        Ok(created) => emit(
            args.out.output,
            &InitConfigOutcome { path, created },
            |o| match o.created {
                true => format!("{}: created, empty\n", o.path.display()),
                false => format!("{}: exists, left as it is\n", o.path.display()),
            },
        )?,
        Err(e) => {
            eprintln!("error: cannot create {}: {e}", path.display());
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `mps mount-shm`: mount the tmpfs unless something is mounted there, say which.
pub(super) fn mps(command: &MpsCommand) -> Result<ExitCode> {
    let MpsCommand::MountShm(args) = command;
    match crate::mps::shm::mount_shm(&args.mps_root, &args.proc_root) {
        Ok(outcome) => {
            emit(args.out.output, &outcome, |o| format!("{o}\n"))?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}
