//! `kube-double [--port PORT] [--kubeconfig PATH]`: serve the double on 127.0.0.1 until killed,
//! for poking at it with kubectl or a binary under manual test. Prints the URL.

use std::net::SocketAddr;
use std::path::PathBuf;

fn main() {
    let mut port: u16 = 0;
    let mut kubeconfig: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--port" => {
                port = args
                    .next()
                    .and_then(|p| p.parse().ok())
                    .unwrap_or_else(|| usage("--port needs a number"))
            }
            "--kubeconfig" => {
                kubeconfig = Some(
                    args.next()
                        .map(PathBuf::from)
                        .unwrap_or_else(|| usage("--kubeconfig needs a path")),
                )
            }
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    let double = kube_double::KubeDouble::start_on(SocketAddr::from(([127, 0, 0, 1], port)))
        .unwrap_or_else(|e| {
            eprintln!("kube-double: {e}");
            std::process::exit(1)
        });
    if let Some(path) = kubeconfig {
        if let Err(e) = double.write_kubeconfig(&path) {
            eprintln!("kube-double: writing {}: {e}", path.display());
            std::process::exit(1);
        }
    }
    println!("{}", double.url());
    loop {
        std::thread::park();
    }
}

fn usage(err: &str) -> ! {
    if !err.is_empty() {
        eprintln!("kube-double: {err}");
    }
    eprintln!("usage: kube-double [--port PORT] [--kubeconfig PATH]");
    std::process::exit(2)
}
