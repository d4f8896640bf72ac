//! `laconic bench shards`: a model of a range-sharded collection fed with the
//! same stream of inserts under different `_id` schemes.
//!
//! The model: K shards; one chunk covering every key at the start; a chunk
//! that grows past `chunk_docs` splits at its median key, both halves staying
//! on its shard (as splits do); after each split a balancer moves the
//! lowest chunk of the shard with the most chunks to the shard with the
//! fewest whenever they differ by more than two. N processes generate ids in
//! turn at a steady total rate. Keys compare as bytes, as BSON compares
//! ObjectIds and equal-length binary values.

use std::collections::{BTreeMap, HashSet};

use super::{Generator, Mode};

/// The `_id` schemes compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    ObjectId,
    UuidV4,
    UuidV7,
    LocalityDefault,
    LocalitySequential,
}

impl Scheme {
    pub const ALL: [Scheme; 5] = [
        Scheme::ObjectId,
        Scheme::UuidV4,
        Scheme::UuidV7,
        Scheme::LocalityDefault,
        Scheme::LocalitySequential,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Scheme::ObjectId => "ObjectId",
            Scheme::UuidV4 => "UUIDv4",
            Scheme::UuidV7 => "UUIDv7",
            Scheme::LocalityDefault => "Locality (default)",
            Scheme::LocalitySequential => "Locality (sequential)",
        }
    }
}

/// The parameters of one simulation.
#[derive(Clone, Debug, clap::Args)]
pub struct Params {
    /// Shards.
    #[arg(long, default_value_t = 8)]
    pub shards: usize,
    /// Generating processes.
    #[arg(long, default_value_t = 16)]
    pub processes: usize,
    /// Inserts per second, all processes together.
    #[arg(long, default_value_t = 100)]
    pub rate: u64,
    /// Simulated hours.
    #[arg(long, default_value_t = 4.0)]
    pub hours: f64,
    /// Documents per chunk before it splits.
    #[arg(long, default_value_t = 2000)]
    pub chunk_docs: usize,
    /// Width of the windows over which write shares are measured, in seconds.
    #[arg(long, default_value_t = 60)]
    pub window_secs: u64,
}

/// What one scheme did.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub scheme: Scheme,
    /// Mean over windows of (writes to the busiest shard) / (writes per shard on average).
    pub hot_mean: f64,
    /// The worst window's ratio.
    pub hot_max: f64,
    /// Mean number of shards holding the documents inserted in one 10-minute window.
    pub shards_per_10min_read: f64,
    pub chunks: usize,
}

struct Chunk {
    shard: usize,
    keys: Vec<Vec<u8>>,
}

struct Cluster {
    /// Lower bound of each chunk → chunk index.
    bounds: BTreeMap<Vec<u8>, usize>,
    chunks: Vec<Chunk>,
    per_shard: Vec<usize>,
    chunk_docs: usize,
}

impl Cluster {
    fn new(shards: usize, chunk_docs: usize) -> Cluster {
        let mut bounds = BTreeMap::new();
        bounds.insert(Vec::new(), 0);
        let mut per_shard = vec![0; shards];
        per_shard[0] = 1;
        Cluster {
            bounds,
            chunks: vec![Chunk {
                shard: 0,
                keys: Vec::new(),
            }],
            per_shard,
            chunk_docs,
        }
    }

    fn chunk_of(&self, key: &[u8]) -> usize {
        self.bounds
            .range::<[u8], _>((std::ops::Bound::Unbounded, std::ops::Bound::Included(key)))
            .next_back()
            .map_or(0, |(_, &c)| c)
    }

    /// Inserts a key and returns the shard that took the write.
    fn insert(&mut self, key: Vec<u8>) -> usize {
        let c = self.chunk_of(&key);
        let shard = self.chunks[c].shard;
        self.chunks[c].keys.push(key);
        if self.chunks[c].keys.len() > self.chunk_docs {
            self.split(c);
            self.balance();
        }
        shard
    }

    fn split(&mut self, c: usize) {
        let keys = &mut self.chunks[c].keys;
        keys.sort_unstable();
        let upper = keys.split_off(keys.len() / 2);
        let bound = upper[0].clone();
        let shard = self.chunks[c].shard;
        self.chunks.push(Chunk { shard, keys: upper });
        self.bounds.insert(bound, self.chunks.len() - 1);
        self.per_shard[shard] += 1;
    }

    fn balance(&mut self) {
        let (max, _) = self
            .per_shard
            .iter()
            .enumerate()
            .max_by_key(|(_, n)| **n)
            .unwrap_or((0, &0));
        let (min, _) = self
            .per_shard
            .iter()
            .enumerate()
            .min_by_key(|(_, n)| **n)
            .unwrap_or((0, &0));
        if self.per_shard[max] <= self.per_shard[min] + 2 {
            return;
        }
        // The lowest chunk of the busiest shard moves.
        if let Some(&c) = self.bounds.values().find(|&&c| self.chunks[c].shard == max) {
            self.chunks[c].shard = min;
            self.per_shard[max] -= 1;
            self.per_shard[min] += 1;
        }
    }
}

/// A small deterministic generator (xorshift64*), so runs repeat exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        for chunk in out.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        out
    }
}

/// Runs one scheme.
pub fn simulate(scheme: Scheme, p: &Params) -> Outcome {
    let start_ms: u64 = 1_700_000_000_000;
    let total = (p.hours * 3600.0 * p.rate as f64) as u64;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut cluster = Cluster::new(p.shards, p.chunk_docs);

    // Per-process state: ObjectId process bytes and counters, Locality generators.
    let oid_process: Vec<[u8; 5]> = (0..p.processes).map(|_| rng.bytes::<5>()).collect();
    let mut oid_counter: Vec<u32> = (0..p.processes)
        .map(|_| rng.next() as u32 & 0x00FF_FFFF)
        .collect();
    let generators: Vec<Generator> = (0..p.processes)
        .map(|i| {
            let mode = if scheme == Scheme::LocalitySequential {
                Mode::Sequential
            } else {
                Mode::Default
            };
            Generator::with_identity(mode, 1000 + i as u16, rng.next() as u32)
        })
        .collect();

    let window_ms = p.window_secs * 1000;
    let warmup = total / 4;
    let mut window = u64::MAX;
    let mut counts = vec![0u64; p.shards];
    let mut ratios = Vec::new();
    let mut inserted: Vec<(u64, Vec<u8>)> = Vec::with_capacity(total as usize);

    let close_window = |counts: &mut Vec<u64>, ratios: &mut Vec<f64>| {
        let sum: u64 = counts.iter().sum();
        if sum > 0 {
            let mean = sum as f64 / counts.len() as f64;
            ratios.push(*counts.iter().max().unwrap_or(&0) as f64 / mean);
        }
        counts.iter_mut().for_each(|c| *c = 0);
    };

    for i in 0..total {
        let ms = start_ms + i * 1000 / p.rate;
        let proc_ = (i % p.processes as u64) as usize;
        let key: Vec<u8> = match scheme {
            Scheme::ObjectId => {
                let mut k = Vec::with_capacity(12);
                k.extend_from_slice(&((ms / 1000) as u32).to_be_bytes());
                k.extend_from_slice(&oid_process[proc_]);
                oid_counter[proc_] = (oid_counter[proc_] + 1) & 0x00FF_FFFF;
                k.extend_from_slice(&oid_counter[proc_].to_be_bytes()[1..]);
                k
            }
            Scheme::UuidV4 => rng.bytes::<16>().to_vec(),
            Scheme::UuidV7 => {
                let mut k = rng.bytes::<16>().to_vec();
                k[0..6].copy_from_slice(&ms.to_be_bytes()[2..8]);
                k
            }
            Scheme::LocalityDefault | Scheme::LocalitySequential => {
                generators[proc_].at(ms).to_vec()
            }
        };
        let shard = cluster.insert(key.clone());
        inserted.push((ms, key));
        if i >= warmup {
            let w = ms / window_ms;
            if w != window {
                close_window(&mut counts, &mut ratios);
                window = w;
            }
            counts[shard] += 1;
        }
    }
    close_window(&mut counts, &mut ratios);

    // Reads of "what was inserted in the same 10 minutes", against the final chunk map.
    let mut touched = Vec::new();
    let mut current = u64::MAX;
    let mut shards: HashSet<usize> = HashSet::new();
    for (ms, key) in &inserted {
        let w = ms / 600_000;
        if w != current {
            if !shards.is_empty() {
                touched.push(shards.len() as f64);
            }
            shards.clear();
            current = w;
        }
        shards.insert(cluster.chunks[cluster.chunk_of(key)].shard);
    }
    if !shards.is_empty() {
        touched.push(shards.len() as f64);
    }

    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    Outcome {
        scheme,
        hot_mean: mean(&ratios),
        hot_max: ratios.iter().copied().fold(0.0, f64::max),
        shards_per_10min_read: mean(&touched),
        chunks: cluster.chunks.len(),
    }
}

/// Runs every scheme and prints the table.
pub fn run(p: &Params) {
    println!(
        "{} shards, {} processes, {} inserts/s for {} h ({} documents), chunks split at {} documents; \
         write shares over {}-s windows after the first quarter",
        p.shards,
        p.processes,
        p.rate,
        p.hours,
        (p.hours * 3600.0 * p.rate as f64) as u64,
        p.chunk_docs,
        p.window_secs
    );
    println!(
        "{:<22} {:>16} {:>16} {:>26} {:>7}",
        "_id scheme", "hot shard (mean)", "hot shard (max)", "shards read per 10 min", "chunks"
    );
    for s in Scheme::ALL {
        let o = simulate(s, p);
        println!(
            "{:<22} {:>15.2}x {:>15.2}x {:>26.1} {:>7}",
            s.name(),
            o.hot_mean,
            o.hot_max,
            o.shards_per_10min_read,
            o.chunks
        );
    }
}
