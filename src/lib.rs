//! gpu-share: share NVIDIA GPUs in Kubernetes.
//!
//! A node label names a sharing profile; gpu-share turns the profile into a plan for the node's
//! GPUs (MIG geometry, MPS, time-slicing replicas) and applies it. Data flows one way:
//!
//! node label → [`profile::Profile`] ([`validate`]d) → [`plan::NodePlan`] (pure) → steps applied → published state.
//!
//! Planning is pure and testable: it takes an observed node and a profile and returns what to
//! change. Only executors touch hardware or the Kubernetes API.

pub mod advise;
pub mod agent;
pub mod apply;
pub mod atomic_file;
pub mod autopilot;
pub mod builtin_plugin;
pub mod cli;
pub mod doctor;
pub mod dra;
pub mod duration;
pub mod field_manager;
pub mod gpu;
pub mod gpu_labels;
pub mod kubelet;
pub mod lease;
pub mod mig;
pub mod mps;
pub mod nvidia_plugin;
pub mod plan;
pub mod profile;
pub mod published;
pub mod sharing;
pub mod timeslice;
pub mod validate;
