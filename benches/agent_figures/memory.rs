//! `memory`: the agent's idle resident memory, with the binary warm in the page cache (as
//! cargo left it) and cold (its cached pages dropped before the agent starts, as on a node that
//! has only run the agent from it: `memory_cache.rs`), under each runtime; what holds it by
//! mapping (`memory_map.rs`); and VmRSS/VmHWM after 1,000 reconciles.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube_double::KubeDouble;
use node_sim::*;

use super::{change, knob, ts_texts, TS};

#[path = "memory_cache.rs"]
mod memory_cache;
#[path = "memory_map.rs"]
mod memory_map;

pub fn memory() {
    let reconciles = knob("GPU_SHARE_BENCH_RECONCILES", 1000usize);
    println!("\n## agent memory (8 simulated H100s, time-slicing profiles)\n");
    idle_by_setup();
    println!("\nthe agent as shipped (current-thread runtime), binary warm in the page cache:\n");
    println!("| NVML library | when | VmRSS | VmHWM |");
    println!("|---|---|---|---|");
    // The agent keeps one NVML session for its lifetime (gpu::SharedGpus). Before it did, it
    // loaded and unloaded the library on every reconcile, and lost 60.6 kB each time with the
    // fake library (benches/README.md).
    memory_run(reconciles, "one session for the agent's lifetime");
}

/// How long the agent is left idle before its memory is read: past tokio's 10 s keep-alive of
/// idle blocking-pool threads, so the threads of the start-up apply are gone, as on a node.
const IDLE: Duration = Duration::from_secs(12);

/// Whether the agent binary's pages are left in the page cache before the agent starts.
#[derive(Clone, Copy, PartialEq)]
enum PageCache {
    /// Read whole first, as cargo leaves a binary it has just linked (fault-around then maps
    /// untouched neighbours too).
    Warm,
    /// Dropped first: only what the agent reads (and the kernel's readahead) gets cached.
    Cold,
}

/// One idle agent's figures (kB, and the thread count).
struct Idle {
    rss: u64,
    anon: u64,
    file: u64,
    threads: u64,
    by_mapping: Vec<(String, u64)>,
}

/// Idle VmRSS of the same build under each runtime, warm and cold, each a new agent that
/// applied one profile and then sat idle for [`IDLE`]. `GPU_SHARE_AGENT_WORKERS` picks a
/// multi-thread runtime (the agent's runtime before: a worker per core, 2 here).
/// glibc's malloc arena caps (`MALLOC_ARENA_MAX`) changed nothing measurable with one runtime
/// thread (benches/README.md) and are no longer measured.
fn idle_by_setup() {
    let setups: [(&str, &[(&str, &str)]); 2] = [
        (
            "multi-thread, 2 workers (the runtime before)",
            &[("GPU_SHARE_AGENT_WORKERS", "2")],
        ),
        ("current-thread (the agent's default)", &[]),
    ];
    println!("idle, {} s after one profile applied:\n", IDLE.as_secs());
    match memory_cache::readahead_kb(gpu_share_bin()) {
        Some(kb) => println!(
            "(the binary's disk reads ahead {kb} KiB around a page fault, `read_ahead_kb`; \
             the cold start caches that much around each first touch of its code)\n"
        ),
        None => println!("(the binary's disk and its read-ahead are not known)\n"),
    }
    println!("| runtime | binary in page cache | VmRSS | RssAnon | RssFile | of it the binary | threads |");
    println!("|---|---|---|---|---|---|---|");
    let mut shipped = Vec::new();
    for (what, env) in setups {
        for cache in [PageCache::Warm, PageCache::Cold] {
            let (idle, cache_note) = idle_agent(env, cache);
            println!(
                "| {what} | {cache_note} | {} | {} | {} | {} | {} |",
                mib(idle.rss),
                mib(idle.anon),
                mib(idle.file),
                mib(binary_kb(&idle.by_mapping)),
                idle.threads
            );
            if env.is_empty() {
                shipped.push((cache, idle));
            }
        }
    }
    print_by_mapping(&shipped);
}

/// Start one agent with `env` (binary `cache` as asked), apply a profile, wait [`IDLE`], read
/// its memory, stop it. Also says how much of the binary was cached when the agent started.
fn idle_agent(env: &[(&str, &str)], cache: PageCache) -> (Idle, String) {
    let api = Arc::new(KubeDouble::start());
    let texts = ts_texts();
    profiles_configmap(&api, &[], &[(TS[0], texts[0].clone())]);
    let mut node = AgentNode::new(&api, "bench-idle", h100s(8, false));
    api.set_node_label(&node.name, PROFILE_LABEL, Some(TS[0]));
    let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, v.to_string())).collect();
    let cache_note = prepare_page_cache(cache);
    node.start_agent(&["--resync-period", "300s"], &env);
    wait_applied_text(&api, &node, &texts[0], Duration::from_secs(60), TS[0]);
    std::thread::sleep(IDLE);
    let (rss, _) = node.agent_memory_kb();
    let (anon, file, threads) = memory_map::status_fields(node.agent_pid());
    let by_mapping = memory_map::resident_by_mapping(node.agent_pid());
    node.kill_agent();
    let idle = Idle {
        rss,
        anon,
        file,
        threads,
        by_mapping,
    };
    (idle, cache_note)
}

/// Read the binary into the page cache, or drop it from there; the note says how much of it
/// is cached now.
fn prepare_page_cache(cache: PageCache) -> String {
    let bin = gpu_share_bin();
    let left = match cache {
        PageCache::Warm => memory_cache::read_into_page_cache(bin),
        PageCache::Cold => memory_cache::drop_from_page_cache(bin),
    };
    let word = match cache {
        PageCache::Warm => "warm",
        PageCache::Cold => "cold",
    };
    match left {
        Ok((cached, total)) => format!("{word} ({cached} of {total} pages at start)"),
        Err(e) => panic!("{}: page cache: {e}", bin.display()),
    }
}

/// The binary's own resident kB in a by-mapping list.
fn binary_kb(by_mapping: &[(String, u64)]) -> u64 {
    by_mapping
        .iter()
        .filter(|(kind, _)| kind == memory_map::BINARY)
        .map(|(_, kb)| kb)
        .sum()
}

/// The shipped agent's idle resident memory by mapping, warm beside cold.
fn print_by_mapping(shipped: &[(PageCache, Idle)]) {
    let of = |want: PageCache| shipped.iter().find(|(c, _)| *c == want).map(|(_, i)| i);
    let (Some(warm), Some(cold)) = (of(PageCache::Warm), of(PageCache::Cold)) else {
        return;
    };
    println!("\nthe agent as shipped, idle, resident by mapping (/proc/<pid>/smaps):\n");
    println!("| mapping | warm | cold |");
    println!("|---|---|---|");
    let kb = |idle: &Idle, kind: &str| {
        idle.by_mapping
            .iter()
            .find(|(k, _)| k == kind)
            .map_or(0, |(_, kb)| *kb)
    };
    for (kind, warm_kb) in &warm.by_mapping {
        println!("| {kind} | {} | {} |", mib(*warm_kb), mib(kb(cold, kind)));
    }
    for (kind, cold_kb) in &cold.by_mapping {
        if kb(warm, kind) == 0 {
            println!("| {kind} | 0.0 MiB | {} |", mib(*cold_kb));
        }
    }
}

fn mib(kb: u64) -> String {
    format!("{:.1} MiB", kb as f64 / 1024.0)
}

fn memory_run(reconciles: usize, what: &str) {
    let api = Arc::new(KubeDouble::start());
    let texts = ts_texts();
    profiles_configmap(
        &api,
        &[],
        &[(TS[0], texts[0].clone()), (TS[1], texts[1].clone())],
    );
    let mut node = AgentNode::new(&api, "bench-mem", h100s(8, false));
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    api.set_node_label(&node.name, PROFILE_LABEL, Some(TS[0]));
    node.start_agent(&["--resync-period", "300s", "--listen", &listen], &[]);
    wait_applied_text(&api, &node, &texts[0], Duration::from_secs(60), TS[0]);
    std::thread::sleep(IDLE);
    let (idle_rss, idle_hwm) = node.agent_memory_kb();

    let started = Instant::now();
    let mut trace = Vec::new();
    for i in 0..reconciles {
        let k = (i + 1) % 2;
        change(&api, &node, TS[k], &texts[k], Duration::from_secs(30));
        if (i + 1) % 250 == 0 {
            trace.push(format!("{}: {} kB", i + 1, node.agent_memory_kb().0));
        }
    }
    let took = started.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    let (rss, hwm) = node.agent_memory_kb();
    let metrics = http_get(port, "/metrics").unwrap_or_default();
    let counted = metric(&metrics, "gpu_share_reconciles_total{result=\"success\"}");
    node.kill_agent();
    eprintln!("VmRSS, NVML {what}: {}", trace.join(", "));

    println!(
        "| {what} | idle, profile applied | {} | {} |",
        mib(idle_rss),
        mib(idle_hwm)
    );
    println!(
        "| {what} | after {reconciles} more reconciles ({:.1} s; /metrics: {} successful in all) | {} | {} |",
        took.as_secs_f64(),
        counted.map_or("?".into(), |c| format!("{c}")),
        mib(rss),
        mib(hwm)
    );
    println!(
        "| {what} | growth per reconcile | {:.1} kB | |",
        (rss as f64 - idle_rss as f64) / reconciles.max(1) as f64
    );
}
