//! Prints each workload instance's size figures (buffers, launches, threads, approximate thread-instructions).

use suite::Size;

fn main() {
    println!(
        "{:<12} {:<7} {:>9} {:>8} {:>9} {:>12}",
        "workload", "size", "bytes", "launches", "threads", "thread-instr"
    );
    for w in suite::all() {
        for size in Size::ALL {
            let i = w.instance(size);
            let bytes: usize = i.buffers.iter().map(|b| b.init.len()).sum();
            let threads: u64 = i.launches.iter().map(|l| l.threads()).sum();
            println!(
                "{:<12} {:<7} {:>9} {:>8} {:>9} {:>12}",
                w.name,
                size.name(),
                bytes,
                i.launches.len(),
                threads,
                i.approx_thread_instrs
            );
        }
    }
}
