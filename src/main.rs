//! `gpu-share`: see `gpu-share --help`.

fn main() -> std::process::ExitCode {
    gpu_share::cli::run()
}
