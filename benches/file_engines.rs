//! The embedded engines the `file:` store could journal to, on its job: group commits
//! of a few dozen puts and deletes of ~100–300-byte values, each commit as durable as
//! the store's `fsync` policy asks (see BENCHMARKS.md, "File store: the engine").
//!
//!   cargo bench --bench file_engines
//!
//! redb commits only with `Durability::Immediate` here: its `Durability::None` commits
//! are lost on a process crash unless a later commit is immediate, so they cannot back
//! an answered 2xx. fjall is measured with a write to the OS per commit (`os`: what a
//! SIGKILL cannot lose) and with an fsync per commit (`always`).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

/// Changes per group commit, as the writer sees them under load.
const BATCH: usize = 64;
/// One in four changes forgets a key (expiry, eviction).
const DELETE_EVERY: usize = 4;

fn value(i: u64) -> Vec<u8> {
    let len = 100 + (i % 200) as usize;
    (0..len).map(|j| (i as usize + j) as u8).collect()
}

fn key(i: u64) -> Vec<u8> {
    format!("wh\0evt_{i:016x}").into_bytes()
}

fn engines(c: &mut Criterion) {
    let mut g = c.benchmark_group("file_engines");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.sample_size(20);

    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("redb")).unwrap();
    let table: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("entries");
    let mut n = 0u64;
    g.bench_function(BenchmarkId::new("redb", "immediate"), |b| {
        b.iter(|| {
            let tx = db.begin_write().unwrap();
            {
                let mut t = tx.open_table(table).unwrap();
                for i in 0..BATCH {
                    n += 1;
                    if i % DELETE_EVERY == 0 && n > BATCH as u64 {
                        t.remove(key(n - BATCH as u64).as_slice()).unwrap();
                    } else {
                        t.insert(key(n).as_slice(), value(n).as_slice()).unwrap();
                    }
                }
            }
            tx.commit().unwrap();
        })
    });

    for (name, mode) in [
        ("os", Some(fjall::PersistMode::Buffer)),
        ("always", Some(fjall::PersistMode::SyncAll)),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let db = fjall::Database::builder(dir.path()).open().unwrap();
        let ks = db
            .keyspace("entries", fjall::KeyspaceCreateOptions::default)
            .unwrap();
        let mut n = 0u64;
        g.bench_function(BenchmarkId::new("fjall", name), |b| {
            b.iter(|| {
                let mut batch = db.batch().durability(mode);
                for i in 0..BATCH {
                    n += 1;
                    if i % DELETE_EVERY == 0 && n > BATCH as u64 {
                        batch.remove(&ks, key(n - BATCH as u64));
                    } else {
                        batch.insert(&ks, key(n), value(n));
                    }
                }
                batch.commit().unwrap();
            })
        });
    }
    g.finish();
}

criterion_group!(benches, engines);
criterion_main!(benches);
