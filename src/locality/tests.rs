use std::collections::HashSet;

use proptest::prelude::*;

use super::*;

#[test]
fn the_seeds_example_counter_leads_with_20be0ffc() {
    let f = Fields {
        counter: 3_488_672_514,
        process: 12_618,
        mac: 0x0d53_7a50,
        millis: 1_350_327_498_450,
    };
    let id = format(&f.encode(Mode::Default));
    assert!(id.starts_with("20be0ffc"), "{id}");
    assert_eq!(&id[14..15], "b", "the version nibble");
}

#[test]
fn the_decoder_prints_the_seeds_format() {
    let f = Fields {
        counter: 3_488_672_514,
        process: 12_618,
        mac: 0x0d53_7a50,
        millis: 1_350_327_498_450,
    };
    let text = describe(&f.encode(Mode::Default), Mode::Default).unwrap();
    assert_eq!(
        text,
        "counter     : 3,488,672,514\n\
         process id  : 12,618\n\
         MAC address : __:__:_d:53:7a:50\n\
         timestamp   : 1,350,327,498,450 (Mon, 15 Oct 2012 18:58:18.450 UTC)"
    );
}

#[test]
fn layout_bits() {
    let f = Fields {
        counter: 0x1234_5678,
        process: 0xABCD,
        mac: 0xFEDC_BA98,
        millis: 0x0102_0304_0506,
    };
    let b = f.encode(Mode::Sequential);
    assert_eq!(
        &b[0..4],
        &[0x12, 0x34, 0x56, 0x78],
        "sequential counters are big-endian"
    );
    assert_eq!(&b[4..6], &[0xAB, 0xCD]);
    assert_eq!(b[6], 0xBE, "0xB, then the top 4 of the MAC's 28 bits");
    assert_eq!(&b[7..10], &[0xDC, 0xBA, 0x98]);
    assert_eq!(&b[10..16], &[1, 2, 3, 4, 5, 6]);
    let back = Fields::decode(&b, Mode::Sequential).unwrap();
    assert_eq!(
        back,
        Fields {
            mac: 0x0EDC_BA98,
            ..f
        }
    );
    let d = f.encode(Mode::Default);
    assert_eq!(
        &d[0..4],
        &[0x87, 0x65, 0x43, 0x21],
        "default counters are nibble-reversed"
    );
    assert_eq!(
        Fields::decode(&d, Mode::Default).unwrap().counter,
        0x1234_5678
    );
    let mut not_ours = b;
    not_ours[6] = 0x4E;
    assert!(Fields::decode(&not_ours, Mode::Default).is_none());
}

#[test]
fn nibble_reversal() {
    assert_eq!(reverse_nibbles(0x1234_5678), 0x8765_4321);
    assert_eq!(reverse_nibbles(0xcff0_eb02), 0x20be_0ffc);
    assert_eq!(reverse_nibbles(reverse_nibbles(0xdead_beef)), 0xdead_beef);
}

#[test]
fn the_odd_increment_wraps_and_leading_digits_vary() {
    let g = Generator::with_identity(Mode::Default, 1, 2);
    g.counter
        .store(u32::MAX - 5, std::sync::atomic::Ordering::Relaxed);
    let first = Fields::decode(&g.at(1000), Mode::Default).unwrap().counter;
    assert_eq!(
        first,
        (u32::MAX - 5).wrapping_add(INCREMENT),
        "wraps mod 2^32"
    );
    let leading: HashSet<char> = (0..16)
        .map(|_| format(&g.at(1000)).chars().next().unwrap())
        .collect();
    assert!(
        leading.len() >= 8,
        "consecutive ids lead with different digits: {leading:?}"
    );
    assert_eq!(INCREMENT % 2, 1);
}

#[test]
fn sequential_mode_starts_from_the_window_hash_and_counts_up() {
    let g = Generator::with_identity(Mode::Sequential, 1, 2);
    let t = 1_350_327_498_450;
    let a = Fields::decode(&g.at(t), Mode::Sequential).unwrap().counter;
    let b = Fields::decode(&g.at(t + 1), Mode::Sequential)
        .unwrap()
        .counter;
    assert_eq!(a, window_seed(t));
    assert_eq!(b, a.wrapping_add(1));
    // Another machine in the same window starts at the same value.
    let other = Generator::with_identity(Mode::Sequential, 9, 9);
    assert_eq!(
        Fields::decode(&other.at(t + 5000), Mode::Sequential)
            .unwrap()
            .counter,
        a
    );
    // The window key is yyyyMMddHHm: 18:58 falls in "201210151 8 5".
    let digest = md5::Md5::digest(b"20121015185");
    assert_eq!(
        a,
        u32::from_le_bytes([digest[0], digest[1], digest[2], digest[3]])
    );
    // A new window restarts the counter.
    let next = Fields::decode(&g.at(t + 600_000), Mode::Sequential)
        .unwrap()
        .counter;
    assert_eq!(next, window_seed(t + 600_000));
}

#[test]
fn node_ids_replace_process_and_mac() {
    let g = Generator::with_node_id(Mode::Default, 0x0123_4567_89AB);
    let f = Fields::decode(&g.next(), Mode::Default).unwrap();
    assert_eq!(f.process, 0x89AB);
    assert_eq!(f.mac, 0x0123_4567);
}

#[test]
fn parse_and_format() {
    let b = Fields {
        counter: 1,
        process: 2,
        mac: 3,
        millis: 4,
    }
    .encode(Mode::Default);
    let s = format(&b);
    assert_eq!(s.len(), 36);
    assert_eq!(parse(&s), Some(b));
    assert_eq!(parse("xyz"), None);
}

#[test]
fn no_duplicates_across_8_threads_of_1m_ids() {
    let g = std::sync::Arc::new(Generator::new(Mode::Default));
    let per_thread = 1_000_000;
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let g = g.clone();
            std::thread::spawn(move || (0..per_thread).map(|_| g.next()).collect::<Vec<_>>())
        })
        .collect();
    let mut all: Vec<[u8; 16]> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n);
}

proptest! {
    #[test]
    fn derived_ids_are_reversible(oid in any::<[u8; 12]>(), sequential in any::<bool>()) {
        let mode = if sequential { Mode::Sequential } else { Mode::Default };
        let uuid = from_object_id(&oid, mode);
        prop_assert_eq!(uuid[6] >> 4, VERSION);
        prop_assert_eq!(to_object_id(&uuid), Some(oid));
        let f = Fields::decode(&uuid, mode).unwrap();
        prop_assert_eq!(f.millis / 1000, u64::from(u32::from_be_bytes([oid[0], oid[1], oid[2], oid[3]])));
    }

    #[test]
    fn generated_ids_are_not_mistaken_for_derived_ones(millis in 0u64..(1 << 40), pid in any::<u16>()) {
        let g = Generator::with_identity(Mode::Default, pid, 0x0123_4567);
        prop_assert!(to_object_id(&g.at(millis * 1000 + 1)).is_none());
    }
}

#[test]
fn the_shard_simulation_shows_the_expected_shape() {
    use super::simulate::{simulate, Params, Scheme};
    let p = Params {
        shards: 4,
        processes: 8,
        rate: 20,
        hours: 3.0,
        chunk_docs: 500,
        window_secs: 60,
    };
    let oid = simulate(Scheme::ObjectId, &p);
    let default = simulate(Scheme::LocalityDefault, &p);
    let sequential = simulate(Scheme::LocalitySequential, &p);
    // Time-ordered ids send every write to one shard: max/mean is K.
    assert!(oid.hot_mean > 3.5, "{oid:?}");
    // The default mode spreads writes.
    assert!(default.hot_mean < 1.6, "{default:?}");
    // Reads of one 10-minute window touch as few shards in sequential mode as
    // with ObjectIds, and every shard in default mode.
    assert!(
        sequential.shards_per_10min_read <= oid.shards_per_10min_read + 0.5,
        "{sequential:?} {oid:?}"
    );
    assert!(
        sequential.shards_per_10min_read < default.shards_per_10min_read - 1.0,
        "{sequential:?}"
    );
    assert!(default.shards_per_10min_read > 3.5, "{default:?}");
}
