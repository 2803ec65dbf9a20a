//! Which pod a host process belongs to, from the cgroup path the kubelet gives each pod.
//!
//! NVML and `/proc` show host PIDs (the agent runs with hostPID); a PID's cgroup path names its
//! pod: `.../kubepods/burstable/pod<uid>/<container>` (cgroupfs driver) or
//! `.../kubepods-burstable-pod<uid_with_underscores>.slice/...` (systemd driver).

use std::path::Path;

/// The pod UID a host PID belongs to, from `<proc_root>/<pid>/cgroup`.
pub fn pod_uid_of(proc_root: &Path, pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    text.lines().find_map(pod_uid_in_cgroup_line)
}

fn pod_uid_in_cgroup_line(line: &str) -> Option<String> {
    let path = line.splitn(3, ':').nth(2)?;
    path.split('/').find_map(|segment| {
        let start = segment.rfind("pod")? + 3;
        let rest = &segment[start..];
        let uid: String = rest
            .chars()
            .take_while(|c| c.is_ascii_hexdigit() || *c == '-' || *c == '_')
            .collect();
        let uid = uid.replace('_', "-");
        (uid.len() == 36 && uid.matches('-').count() == 4).then_some(uid)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_paths_of_both_drivers_name_the_pod() {
        let uid = "0f6c8b0e-5d1a-4c1e-9a57-2b8e3c9d4f10";
        assert_eq!(
            pod_uid_in_cgroup_line(&format!("0::/kubepods/burstable/pod{uid}/8c1d2f")),
            Some(uid.to_string())
        );
        assert_eq!(
            pod_uid_in_cgroup_line(&format!(
                "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-ab.scope",
                uid.replace('-', "_")
            )),
            Some(uid.to_string())
        );
        assert_eq!(
            pod_uid_in_cgroup_line("0::/user.slice/session-2.scope"),
            None
        );
    }
}
