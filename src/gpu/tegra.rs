//! A Jetson/Tegra integrated GPU: a system-on-chip with no PCI device and no NVML, known from
//! the system's own files instead.
//!
//! The files and the rule are those of NVIDIA's device plugin (v0.20, go-nvlib's
//! `HasTegraFiles`): `/etc/nv_tegra_release` exists, or `/sys/devices/soc0/family` starts with
//! `tegra`; a device tree `compatible` entry `nvidia,tegra…` also counts (what `doctor` has
//! always read). The plugin then serves exactly one device, `tegra`, whatever the board, so a
//! Tegra node has one GPU here too. Its product name, which profile rules match with
//! `devices: {product: …}`, is the device tree's `model` (`NVIDIA Jetson AGX Orin Developer
//! Kit`), the name the board gives itself; without a model it is [`UNNAMED_PRODUCT`].
//!
//! A file that exists but cannot be read is an error naming it, never "not a Tegra", and so
//! are files that disagree (a release file on a system whose SoC family is not Tegra): either
//! would otherwise make the agent configure the node as something it may not be.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The product name of a Tegra whose device tree has no `model`.
pub const UNNAMED_PRODUCT: &str = "NVIDIA Tegra integrated GPU";

/// Words that name a Jetson/Tegra board in a product name or a product pattern.
const TEGRA_WORDS: [&str; 4] = ["tegra", "jetson", "orin", "xavier"];

/// Where a Tegra's identifying files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TegraFiles {
    /// L4T's release file.
    pub release: PathBuf,
    /// The SoC's family, `Tegra` on a Jetson.
    pub soc_family: PathBuf,
    /// Device tree directories to try, in order (`compatible`, `model`).
    pub device_trees: Vec<PathBuf>,
}

impl TegraFiles {
    /// The standard paths under `root` (`/`, or the host's root mounted in a pod).
    pub fn under(root: &Path) -> Self {
        let at = |p: &str| root.join(p);
        TegraFiles {
            release: at("etc/nv_tegra_release"),
            soc_family: at("sys/devices/soc0/family"),
            device_trees: vec![at("proc/device-tree"), at("sys/firmware/devicetree/base")],
        }
    }
}

/// What identifies a Jetson/Tegra board.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Tegra {
    /// `L4T R36.4.0`, from the release file (`L4T (release unknown)` when it has no release line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    /// The SoC's `nvidia,tegra…` entry of the device tree's `compatible`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soc: Option<String>,
    /// The device tree's `model`, e.g. `NVIDIA Jetson AGX Orin Developer Kit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// Why the Tegra files could not be believed.
#[derive(Debug, thiserror::Error)]
pub enum TegraError {
    #[error("cannot read {}: {cause} (it says whether this is a Jetson/Tegra; run as root, or mount it into the pod read-only)", .path.display())]
    Unreadable {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{} says this is a Jetson/Tegra, but {} says {found:?}: the files disagree, so gpu-share does not guess the GPU (remove the stray file, or fix the host root given with --host-root)", .claims.display(), .denies.display())]
    Contradictory {
        claims: PathBuf,
        denies: PathBuf,
        found: String,
    },
}

impl Tegra {
    /// `NVIDIA Jetson Orin Nano Developer Kit, L4T R36.4.0, nvidia,tegra234`, for messages.
    pub fn describe(&self) -> String {
        [&self.model, &self.release, &self.soc]
            .into_iter()
            .flatten()
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The name profile rules match: the board's model, or [`UNNAMED_PRODUCT`].
    pub fn product(&self) -> String {
        self.model
            .clone()
            .unwrap_or_else(|| UNNAMED_PRODUCT.to_string())
    }
}

/// Whether a product name (or a product pattern of a rule) names a Jetson/Tegra board.
pub fn names_a_tegra(product: &str) -> bool {
    let lower = product.to_ascii_lowercase();
    TEGRA_WORDS.iter().any(|word| lower.contains(word))
}

/// The Tegra these files describe; `None` when they say this is no Tegra (none exists).
pub fn detect(files: &TegraFiles) -> Result<Option<Tegra>, TegraError> {
    let release_text = read_if_present(&files.release)?;
    let family = read_if_present(&files.soc_family)?.map(|f| f.trim().to_string());
    let device_tree = files.device_trees.iter().find(|d| d.is_dir());
    let compatible = match device_tree {
        Some(dir) => read_bytes_if_present(&dir.join("compatible"))?,
        None => None,
    };
    let soc = compatible.as_deref().and_then(tegra_compatible);
    let family_is_tegra = family
        .as_deref()
        .is_some_and(|f| f.to_ascii_lowercase().starts_with("tegra"));
    if release_text.is_none() && !family_is_tegra && soc.is_none() {
        return Ok(None);
    }
    let claims = if release_text.is_some() {
        files.release.clone()
    } else if family_is_tegra {
        files.soc_family.clone()
    } else {
        device_tree
            .map(|d| d.join("compatible"))
            .unwrap_or_default()
    };
    if let Some(found) = family.filter(|f| !f.is_empty() && !family_is_tegra) {
        return Err(TegraError::Contradictory {
            claims,
            denies: files.soc_family.clone(),
            found,
        });
    }
    if let (Some(dir), Some(bytes), None) = (device_tree, &compatible, &soc) {
        return Err(TegraError::Contradictory {
            claims,
            denies: dir.join("compatible"),
            found: entries(bytes).collect::<Vec<_>>().join(", "),
        });
    }
    let model = match device_tree {
        Some(dir) => read_bytes_if_present(&dir.join("model"))?.and_then(|bytes| {
            let s = String::from_utf8_lossy(&bytes)
                .trim_end_matches('\0')
                .trim()
                .to_string();
            (!s.is_empty()).then_some(s)
        }),
        None => None,
    };
    Ok(Some(Tegra {
        release: release_text
            .map(|t| parse_l4t_release(&t).unwrap_or_else(|| "L4T (release unknown)".into())),
        soc,
        model,
    }))
}

fn read_if_present(path: &Path) -> Result<Option<String>, TegraError> {
    Ok(read_bytes_if_present(path)?.map(|b| String::from_utf8_lossy(&b).into_owned()))
}

fn read_bytes_if_present(path: &Path) -> Result<Option<Vec<u8>>, TegraError> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(cause) => Err(TegraError::Unreadable {
            path: path.to_path_buf(),
            cause,
        }),
    }
}

/// The NUL-separated entries of a device tree `compatible`.
fn entries(bytes: &[u8]) -> impl Iterator<Item = &str> {
    bytes
        .split(|b| *b == 0)
        .filter_map(|s| std::str::from_utf8(s).ok())
        .filter(|s| !s.is_empty())
}

fn tegra_compatible(bytes: &[u8]) -> Option<String> {
    entries(bytes)
        .find(|s| s.starts_with("nvidia,tegra"))
        .map(str::to_string)
}

/// `# R36 (release), REVISION: 4.0, GCID: …` → `L4T R36.4.0`.
pub fn parse_l4t_release(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.contains("REVISION"))?;
    let major = line.split_whitespace().find(|w| {
        w.starts_with('R') && w[1..].bytes().all(|b| b.is_ascii_digit()) && w.len() > 1
    })?;
    let revision = line.split("REVISION:").nth(1)?.split(',').next()?.trim();
    Some(format!("L4T {major}.{revision}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RELEASE: &str = "# R36 (release), REVISION: 4.0, GCID: 37537400, BOARD: generic, EABI: aarch64, DATE: Fri Sep 13 04:36:44 UTC 2024\n";

    fn root() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    fn write(root: &Path, path: &str, bytes: &[u8]) {
        let path = root.join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }

    #[test]
    fn reads_the_l4t_release() {
        assert_eq!(parse_l4t_release(RELEASE).as_deref(), Some("L4T R36.4.0"));
        assert_eq!(parse_l4t_release("nothing"), None);
    }

    #[test]
    fn a_system_without_the_files_is_no_tegra() {
        let dir = root();
        write(dir.path(), "sys/devices/soc0/family", b"jep106:0426\n");
        assert_eq!(detect(&TegraFiles::under(dir.path())).unwrap(), None);
    }

    #[test]
    fn a_jetson_is_known_by_its_release_file_and_named_by_its_model() {
        let dir = root();
        write(dir.path(), "etc/nv_tegra_release", RELEASE.as_bytes());
        write(dir.path(), "sys/devices/soc0/family", b"Tegra\n");
        write(
            dir.path(),
            "sys/firmware/devicetree/base/compatible",
            b"nvidia,p3768-0000+p3767-0005\0nvidia,p3767-0005\0nvidia,tegra234\0",
        );
        write(
            dir.path(),
            "sys/firmware/devicetree/base/model",
            b"NVIDIA Jetson Orin Nano Developer Kit\0",
        );
        let tegra = detect(&TegraFiles::under(dir.path())).unwrap().unwrap();
        assert_eq!(tegra.release.as_deref(), Some("L4T R36.4.0"));
        assert_eq!(tegra.soc.as_deref(), Some("nvidia,tegra234"));
        assert_eq!(tegra.product(), "NVIDIA Jetson Orin Nano Developer Kit");
    }

    /// go-nvlib's `HasTegraFiles`: the SoC family alone, `tegra` in any case, is enough.
    #[test]
    fn the_soc_family_alone_is_enough_and_an_unnamed_board_gets_the_generic_name() {
        let dir = root();
        write(dir.path(), "sys/devices/soc0/family", b"Tegra\n");
        let tegra = detect(&TegraFiles::under(dir.path())).unwrap().unwrap();
        assert_eq!(tegra.release, None);
        assert_eq!(tegra.product(), UNNAMED_PRODUCT);
    }

    #[test]
    fn an_unreadable_file_is_an_error_naming_it() {
        let dir = root();
        // A directory where the release file should be: reading it fails (EISDIR), as root too.
        fs::create_dir_all(dir.path().join("etc/nv_tegra_release")).unwrap();
        let e = detect(&TegraFiles::under(dir.path())).unwrap_err();
        assert!(matches!(e, TegraError::Unreadable { .. }), "{e}");
        assert!(e.to_string().contains("etc/nv_tegra_release"), "{e}");
    }

    #[test]
    fn files_that_disagree_are_an_error_naming_both() {
        let dir = root();
        write(dir.path(), "etc/nv_tegra_release", RELEASE.as_bytes());
        write(dir.path(), "sys/devices/soc0/family", b"jep106:0426\n");
        let e = detect(&TegraFiles::under(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("etc/nv_tegra_release") && e.contains("soc0/family") && e.contains("jep106"),
            "{e}"
        );

        let dir = root();
        write(dir.path(), "etc/nv_tegra_release", RELEASE.as_bytes());
        write(
            dir.path(),
            "proc/device-tree/compatible",
            b"raspberrypi,5-model-b\0brcm,bcm2712\0",
        );
        let e = detect(&TegraFiles::under(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("device-tree/compatible") && e.contains("brcm,bcm2712"),
            "{e}"
        );
    }

    #[test]
    fn tegra_words_are_found_in_names_and_patterns() {
        for name in [
            "NVIDIA Jetson AGX Orin",
            "*Xavier*",
            "NVIDIA Tegra X1",
            "Orin (nvgpu)",
        ] {
            assert!(names_a_tegra(name), "{name}");
        }
        for name in ["NVIDIA GeForce RTX 3090", "NVIDIA H100*"] {
            assert!(!names_a_tegra(name), "{name}");
        }
    }
}
