//! `gpu-share-demo`: the gpu-share agent on a simulated 8 × H100 node, in one process and on
//! loopback only. It starts the Kubernetes API double, the node's fake NVML, a simulated
//! kubelet (PodResources and the device-plugin manager) and the real agent serving its built-in
//! device plugin, then tells a scripted story (`gpu-share-demo`), or leaves it all running for
//! kubectl and curl (`gpu-share-demo --interactive`).

mod autopilot;
mod profiles;
mod show;
mod sim;
mod story;

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Leave the simulated node and its agent running, print a KUBECONFIG and example
    /// commands, and wait for Ctrl-C instead of telling the story.
    #[arg(long)]
    interactive: bool,
    /// The API double's port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    port: u16,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu-share-demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> anyhow::Result<()> {
    let paths = sim::Paths::new()?;
    // First, while this process has one thread: see point_environment_here.
    sim::point_environment_here(&paths);
    sim::log_agent_to(&paths.path("agent.log"))?;
    let show = show::Show::new();
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, cli.port));
    let world = sim::World::start(paths, addr, &story::profiles())?;
    if cli.interactive {
        serve(&world)
    } else {
        tell_story(&world, &show).inspect_err(|_| {
            let log = std::fs::read_to_string(&world.agent_log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            eprintln!("agent log, last lines:");
            for line in tail.iter().rev() {
                eprintln!("  {line}");
            }
        })
    }
}

/// The scripted story: a person's profiles (`story`), then the autopilot's (`autopilot`).
fn tell_story(world: &sim::World, show: &show::Show) -> anyhow::Result<()> {
    story::run(world, show)?;
    autopilot::demand_decides(world, show)?;
    story::done(show);
    Ok(())
}

/// Print how to reach the simulated cluster, then wait for Ctrl-C.
fn serve(world: &sim::World) -> anyhow::Result<()> {
    let kubeconfig = world.node.path("kubeconfig");
    let node = sim::NODE;
    println!("gpu-share demo running: API double at {}", world.api.url());
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!("  kubectl get nodes -L gpu-share.dev/profile,gpu-share.dev/profile.state");
    println!("  kubectl label node {node} gpu-share.dev/profile=inference-small --overwrite");
    println!("  kubectl label node {node} gpu-share.dev/profile=inference-mixed --overwrite");
    println!("  kubectl get events.events.k8s.io -A   # the agent writes events.k8s.io/v1 Events");
    println!("  kubectl get node {node} -o jsonpath='{{.status.allocatable}}'");
    println!(
        "  curl -s http://127.0.0.1:{}/metrics | grep gpu_share_",
        world.metrics_port
    );
    println!("profiles in configmap gpu-share/gpu-share-profiles: inference-small, inference-mixed, broken");
    println!("the autopilot, by hand (the node has GFD's labels; pods requesting nvidia.com/* stay pending here):");
    println!("  kubectl label node {node} gpu-share.dev/autopilot=enabled");
    println!(
        "  kubectl run medium-0 --image=x --overrides='{{\"spec\":{{\"containers\":[{{\"name\":\"medium-0\",\"image\":\"x\",\"resources\":{{\"limits\":{{\"nvidia.com/mig-3g.40gb\":\"1\"}}}}}}]}}}}'"
    );
    println!("  cargo run --release -p gpu-share -- autopilot --plugin builtin --debounce 1s --dry-run   # then without --dry-run");
    println!("  kubectl -n gpu-share get configmap gpu-share-autopilot-status -o jsonpath='{{.data.status\\.yaml}}'");
    println!("agent log: {}", world.agent_log.display());
    println!("Ctrl-C stops it all.");
    world.block_on(tokio::signal::ctrl_c())?;
    Ok(())
}
