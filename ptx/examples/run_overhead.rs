//! Fixed cost of one `Launch::run` call (tiny kernel) by worker count: the cost a time-slice
//! scheduler pays per slice. `cargo run -p ptx --release --example run_overhead`.

use std::sync::Arc;
use std::time::Instant;

use ptx::{FlatMemory, Launch, LaunchConfig, Limits, RunControl};

const K: &str = ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k()\n{\nret;\n}\n";

fn main() {
    let m = Arc::new(ptx::parse(K).expect("parse"));
    let mem = FlatMemory::new(0x1000, 4096);
    for workers in [1usize, 2, 4] {
        let n = 2000;
        let t = Instant::now();
        for _ in 0..n {
            let cfg = LaunchConfig {
                grid: [4, 1, 1],
                block: [32, 1, 1],
                dynamic_shared: 0,
                params: Vec::new(),
            };
            let mut l = Launch::new(m.clone(), "k", cfg, &Limits::default()).expect("launch");
            let _ = l.run(&mem, &RunControl::new(workers));
        }
        println!(
            "workers={workers}: {:.1} us per launch+run of a 4-CTA empty kernel",
            t.elapsed().as_secs_f64() / n as f64 * 1e6
        );
    }
}
