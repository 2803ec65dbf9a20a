//! The GPUs as the agent last read them: one NVML read (off the async threads) remembered for
//! the next plan, forgotten after the agent's own NVML writes (see `plan_inventory`).

use super::reconcile::Reconciler;
use crate::gpu::Gpus;
use crate::plan::ObservedNode;

/// Why the GPUs could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    #[error(transparent)]
    Nvml(#[from] crate::gpu::GpuError),
    /// The blocking read panicked or was cancelled.
    #[error("the NVML read did not finish: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl Reconciler {
    /// Read the GPUs from NVML, and remember what was read.
    pub(super) async fn observe(&self) -> Result<ObservedNode, ObserveError> {
        let gpus = self.gpus.clone();
        let observed = tokio::task::spawn_blocking(move || gpus.with(Gpus::observe)).await??;
        *self.inventory.lock().expect("not poisoned") = Some(observed.clone());
        Ok(observed)
    }

    pub(super) fn remembered_inventory(&self) -> Option<ObservedNode> {
        self.inventory.lock().expect("not poisoned").clone()
    }

    pub(super) fn forget_inventory(&self) {
        *self.inventory.lock().expect("not poisoned") = None;
    }
}
