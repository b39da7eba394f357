//! The two expiry indexes side by side: touch 1,000,000 keys, then sweep
//! them all as expired (see BENCHMARKS.md).

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use estafeta_session::Timestamp;
use estafeta_session::index::{BucketIndex, ExpiryIndex, ListMapIndex};

const N: u64 = 1_000_000;

fn touch_all<I: ExpiryIndex<u64>>(index: &mut I) {
    for k in 0..N {
        // Expirations spread over an hour, accesses over ten minutes.
        index.touch(
            &k,
            Some(Timestamp((k * 7919) % 3_600_000)),
            Some(Timestamp(k % 600_000)),
        );
    }
}

fn bench_index<I: ExpiryIndex<u64>>(c: &mut Criterion, name: &str, make: fn() -> I) {
    let mut group = c.benchmark_group(format!("expiry_index/{name}"));
    group.throughput(Throughput::Elements(N));
    group.sample_size(10);
    group.bench_function("touch_1m", |b| {
        b.iter_batched(
            make,
            |mut i| {
                touch_all(&mut i);
                i
            },
            BatchSize::PerIteration,
        )
    });
    group.bench_function("retouch_1m", |b| {
        b.iter_batched(
            || {
                let mut i = make();
                touch_all(&mut i);
                i
            },
            |mut i| {
                touch_all(&mut i);
                i
            },
            BatchSize::PerIteration,
        )
    });
    group.bench_function("sweep_1m", |b| {
        b.iter_batched(
            || {
                let mut i = make();
                touch_all(&mut i);
                i
            },
            |mut i| {
                let mut out = Vec::with_capacity(N as usize);
                i.take_expired(Timestamp(3_600_000), &mut out);
                assert_eq!(out.len() as u64, N);
                i
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

fn indexes(c: &mut Criterion) {
    bench_index(c, "list_map", ListMapIndex::<u64>::new);
    bench_index(c, "bucket", BucketIndex::<u64>::new);
}

criterion_group!(benches, indexes);
criterion_main!(benches);
