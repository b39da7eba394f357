//! Memory per idle session against what a user would keep instead, at
//! 1,000 and at 1,000,000 (see BENCHMARKS.md). Not a timing: it prints
//! the heap bytes each side adds per key, counted by a global allocator
//! that tracks the bytes live, so the figure is exact at either size
//! (a resident-size delta is not, at 1,000).
//!
//! - the engine: `Engine<u64, u64>` on `MemoryStorage`, each session
//!   created and given a state, then left idle (in the expiry index);
//! - the baseline: `DashMap<u64, Arc<tokio::sync::Mutex<u64>>>`, the
//!   baseline of the `engine` bench's timings.
//!
//! Each side's figure is what its sessions add to it once made (the
//! empty engine or map is counted before), divided by their number.

// A global allocator can only be implemented with `unsafe`; this one
// forwards every call to `System` and adds a counter.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use estafeta_session::{Engine, MemoryStorage};

/// The system allocator, counting the bytes live.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to `System` unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System::alloc`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is `System::dealloc`'s.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System::alloc_zeroed`'s.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is `System::realloc`'s.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Heap bytes per session the engine adds for `n` idle sessions, and the
/// engine: it is dropped only at the end, so that its tasks' frees do not
/// fall into another measure.
fn engine(rt: &tokio::runtime::Runtime, n: u64) -> (f64, Engine<u64, u64>) {
    let engine: Engine<u64, u64> = rt
        .block_on(Engine::builder(Arc::new(MemoryStorage::new())).open())
        .expect("an engine on memory storage opens");
    let before = live();
    rt.block_on(async {
        for k in 0..n {
            let mut s = engine
                .get(k, true)
                .await
                .expect("a session is made")
                .expect("a session is made when asked to");
            *s.state_mut() = k;
        }
    });
    // The expiry manager indexes the released sessions on its own task,
    // waking at least once a second: its share is counted once the bytes
    // live stop changing over more than a second.
    let mut last = live();
    loop {
        rt.block_on(async { tokio::time::sleep(Duration::from_millis(1100)).await });
        let now = live();
        if now.abs_diff(last) <= last / 1000 {
            break;
        }
        last = now;
    }
    let added = live().saturating_sub(before);
    assert_eq!(engine.stats().in_memory, n);
    (added as f64 / n as f64, engine)
}

/// Heap bytes per entry the baseline adds for `n` entries.
fn baseline(n: u64) -> f64 {
    let map: DashMap<u64, Arc<tokio::sync::Mutex<u64>>> = DashMap::new();
    let before = live();
    for k in 0..n {
        map.insert(k, Arc::new(tokio::sync::Mutex::new(k)));
    }
    let added = live().saturating_sub(before);
    assert_eq!(map.len() as u64, n);
    added as f64 / n as f64
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    println!(
        "| idle sessions | engine, bytes each | DashMap + Arc<Mutex>, bytes each | engine / baseline |"
    );
    println!("|---|---|---|---|");
    let mut engines = Vec::new();
    for n in [1_000u64, 1_000_000] {
        let b = baseline(n);
        let (e, kept) = engine(&rt, n);
        engines.push(kept);
        println!("| {n} | {e:.0} | {b:.0} | {:.2} |", e / b);
    }
    drop(engines);
}
