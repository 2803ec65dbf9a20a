//! The procfs files the NVIDIA kernel module publishes for MIG, which NVIDIA's device plugin
//! and container toolkit read beside NVML: `driver/nvidia-caps/mig-minors` (capability name →
//! minor of `/dev/nvidia-caps/nvidia-cap<minor>`) and one
//! `driver/nvidia/capabilities/gpu<minor>/mig/gi<G>[/ci<C>]/access` file per existing GPU and
//! compute instance. NVIDIA's plugin exits without them ("missing MIG GPU instance capability
//! path: /proc/driver/nvidia/capabilities/gpu0/mig/gi7/access",
//! docs/sources.md#device-plugin-nvml).
//!
//! With `FAKE_NVML_PROC_ROOT` set (a simulated host's `proc` directory), the library keeps
//! these files in step with the state, as the driver does: at `nvmlInit`, when the state file
//! changes, and after every mutation.

use std::io;
use std::path::Path;

use crate::state::State;

/// GPUs `mig-minors` lists: the driver's table always covers 32 (`gpu0` … `gpu31`).
const TABLE_GPUS: u32 = 32;
/// GPU instance ids 0..14 (`KMIGMGR_MAX_GPU_SWIZZID`, mig-nvml.md 1.4).
const GIS: u32 = 15;
/// Compute instance ids 0..7.
const CIS: u32 = 8;
/// `/dev/nvidia-caps` minors per GPU: each GI's own plus its CIs'.
const PER_GPU: u32 = GIS * (1 + CIS);
/// Mode of the access files, 0444, as the driver creates them (inferred from `ls -l` of
/// `/dev/nvidia-caps`, which mirrors it).
const ACCESS_MODE: u32 = 0o444;

/// Minor of `gpu<gpu>/gi<gi>/access`: `config` is 1, `monitor` 2, then per GPU, per GI, the
/// GI's minor followed by its eight CIs' (so `gpu3/gi3/ci3/access` is 439, as NVIDIA's DRA
/// driver quotes from a real `mig-minors` in `cmd/gpu-kubelet-plugin/nvlib.go`).
pub fn gi_minor(gpu: u32, gi: u32) -> u32 {
    3 + gpu * PER_GPU + gi * (1 + CIS)
}

/// Minor of `gpu<gpu>/gi<gi>/ci<ci>/access`.
pub fn ci_minor(gpu: u32, gi: u32, ci: u32) -> u32 {
    gi_minor(gpu, gi) + 1 + ci
}

/// The whole `mig-minors` text.
pub fn mig_minors() -> String {
    let mut out = String::from("config 1\nmonitor 2\n");
    for gpu in 0..TABLE_GPUS {
        for gi in 0..GIS {
            out += &format!("gpu{gpu}/gi{gi}/access {}\n", gi_minor(gpu, gi));
            for ci in 0..CIS {
                out += &format!("gpu{gpu}/gi{gi}/ci{ci}/access {}\n", ci_minor(gpu, gi, ci));
            }
        }
    }
    out
}

/// A directory to keep (`gi13`, `ci0`) and the minor its `access` file names.
type Entry = (String, u32);
/// A GPU instance's directory, its minor, and its compute instances' directories.
type InstanceDir = (String, u32, Vec<Entry>);

/// One capability file's text (the format `nvidia-container-toolkit`'s nvcaps reads).
fn access_file(minor: u32) -> String {
    format!("DeviceFileMinor: {minor}\nDeviceFileMode: {ACCESS_MODE}\nDeviceFileModify: 1\n")
}

/// Bring `root` (a `proc` directory) in line with `state`: the static `mig-minors`, and the
/// capability files of exactly the instances that exist on GPUs with MIG on.
pub fn sync(root: &Path, state: &State) -> io::Result<()> {
    let caps = root.join("driver/nvidia-caps");
    std::fs::create_dir_all(&caps)?;
    let minors = caps.join("mig-minors");
    if !minors.exists() {
        std::fs::write(&minors, mig_minors())?;
    }
    for (index, gpu) in state.gpus.iter().enumerate() {
        let minor = gpu.minor_number.unwrap_or(index as u32);
        let mig = root.join(format!("driver/nvidia/capabilities/gpu{minor}/mig"));
        let on = gpu.mig.is_some_and(|m| m.current);
        let gis = gpu.gpu_instances.iter().filter(|_| on);
        let wanted: Vec<InstanceDir> = gis
            .map(|g| {
                let cis = g.compute_instances.iter();
                let cis = cis.map(|c| (format!("ci{}", c.id), ci_minor(minor, g.id, c.id)));
                (format!("gi{}", g.id), gi_minor(minor, g.id), cis.collect())
            })
            .collect();
        let names = wanted.iter().map(|(n, ..)| n.as_str());
        remove_others(&mig, &names.collect::<Vec<_>>())?;
        for (gi, gi_minor, cis) in &wanted {
            let dir = mig.join(gi);
            write_access(&dir, *gi_minor)?;
            remove_others(
                &dir,
                &cis.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            )?;
            for (ci, minor) in cis {
                write_access(&dir.join(ci), *minor)?;
            }
        }
    }
    Ok(())
}

/// Write `dir/access` (creating `dir`) unless it already says the same.
fn write_access(dir: &Path, minor: u32) -> io::Result<()> {
    let file = dir.join("access");
    let text = access_file(minor);
    if std::fs::read_to_string(&file).ok().as_deref() != Some(text.as_str()) {
        std::fs::create_dir_all(dir)?;
        std::fs::write(file, text)?;
    }
    Ok(())
}

/// Remove the `gi*`/`ci*` directories under `dir` not named in `keep`, as the driver removes
/// the entries of destroyed instances (and leaves the others alone for readers).
fn remove_others(dir: &Path, keep: &[&str]) -> io::Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let instance = name.starts_with("gi") || name.starts_with("ci");
        if instance && !keep.contains(&name.as_str()) {
            std::fs::remove_dir_all(e.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Gpu;

    #[test]
    fn minors_match_a_real_table() {
        // Lines quoted from a real mig-minors in NVIDIA's k8s-dra-driver-gpu (nvlib.go).
        let table = mig_minors();
        for line in [
            "gpu0/gi0/access 3",
            "gpu0/gi0/ci2/access 6",
            "gpu3/gi3/ci3/access 439",
            "gpu6/gi11/ci7/access 920",
        ] {
            assert!(table.lines().any(|l| l == line), "{line}");
        }
        assert_eq!(table.lines().count(), 2 + 32 * 15 * 9);
    }

    #[test]
    fn capability_files_follow_the_instances() {
        let root = tempfile::tempdir().unwrap();
        let mut state = State::with_gpus([Gpu::mig("h100").mig_enabled(), Gpu::mig("h100")]);
        let gi = state.gpus[0].create_gpu_instance(19, None).unwrap();
        state.gpus[0].create_compute_instance(gi, 0).unwrap();
        sync(root.path(), &state).unwrap();
        let access = root.path().join(format!(
            "driver/nvidia/capabilities/gpu0/mig/gi{gi}/ci0/access"
        ));
        let text = std::fs::read_to_string(&access).unwrap();
        assert!(text.starts_with(&format!("DeviceFileMinor: {}\n", ci_minor(0, gi, 0))));
        assert!(!root
            .path()
            .join("driver/nvidia/capabilities/gpu1/mig")
            .exists());
        state.gpus[0].gpu_instances.clear();
        sync(root.path(), &state).unwrap();
        assert!(!access.exists(), "a destroyed instance's file goes away");
    }
}
