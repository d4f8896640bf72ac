//! Seed 002's figures, pinned.

use std::path::PathBuf;

use super::*;

fn fixture(name: &str) -> Vec<RawDocumentBuf> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    read_file(&path).unwrap()
}

fn breakdown(name: &str) -> Breakdown {
    let mut b = Breakdown::default();
    for d in fixture(name) {
        b.add(d.as_bytes()).unwrap();
    }
    b
}

#[test]
fn the_seeds_baseline_figures_exactly() {
    let b = breakdown("seed002-metrics.json");
    assert_eq!(b.total, 1543);
    assert_eq!(b.attributes, 463);
    assert_eq!(b.null_terminators, 189);
    assert_eq!(b.document_lengths_total(), 104);
    assert_eq!(b.data(), 738);
    assert_eq!(format!("{:.2}", b.overhead()), "52.17");
    assert_eq!(
        b.data_by_type,
        vec![
            ("DOUBLE".to_owned(), 96),
            ("STRING".to_owned(), 546),
            ("INT64".to_owned(), 96)
        ]
    );
    let lengths: Vec<(&str, usize)> = b
        .document_lengths
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    assert_eq!(lengths, vec![("metrics", 52), ("root", 4), ("tags", 48)]);
    let data: Vec<(&str, usize)> = b
        .data_by_attribute
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    assert_eq!(
        data,
        vec![
            ("id", 18),
            ("metric", 144),
            ("percentile", 96),
            ("tags", 288),
            ("timestamp", 96),
            ("value", 96)
        ]
    );
    // The text report is the seed's, line for line.
    let seed = "raw.json
+----------------------------------------------+
data size by type (total): 738B
\t DOUBLE: 96B
\t STRING: 546B
\t INT64: 96B
binary type markers (total): 0B
+----------------------------------------------+
attribute (total): 463B
null terminators: 189B
+----------------------------------------------+
document lengths (total): 104B
\tmetrics: 52B
\troot: 4B
\ttags: 48B
+----------------------------------------------+
data (total): 738B
\tid: 18B
\tmetric: 144B
\tpercentile: 96B
\ttags: 288B
\ttimestamp: 96B
\tvalue: 96B
\t-------------------------------------------+
\tDOUBLE: 96B
\tSTRING: 546B
\tINT64: 96B
+----------------------------------------------+
document size (total): 1543B
Overhead: 52.17%
";
    assert_eq!(text("raw.json", &b), seed);
}

#[test]
fn the_seeds_later_variants_have_the_sizes_it_states() {
    for (file, total, overhead, markers) in [
        ("seed002-normalised.json", 1324, "51.66", 0),
        ("seed002-indexed.json", 1090, "55.96", 0),
        ("seed002-indexed-bitset.json", 870, "57.01", 4),
        ("seed002-matrix.json", 366, "44.81", 4),
        ("seed002-binary.json", 328, "37.20", 5),
        ("seed002-minimised.json", 304, "32.24", 5),
    ] {
        let b = breakdown(file);
        assert_eq!(b.total, total, "{file}");
        assert_eq!(format!("{:.2}", b.overhead()), overhead, "{file}");
        assert_eq!(b.binary_markers, markers, "{file}");
    }
}

#[test]
fn the_projection_tokenizes_under_the_policy() {
    let docs = fixture("seed002-metrics.json");
    let a = analyse("raw.json", &docs, &Policy::new(2, &[], "laconic")).unwrap();
    assert_eq!(a.logical.total, 1543);
    assert_eq!(a.tokenized.total, 1188);
    assert_eq!(a.tokenized.data(), 738, "values are untouched");
    assert!(a.saved_percent() > 20.0);
    let svg = chart_svg(&[("raw".into(), &a.logical), ("laconic".into(), &a.tokenized)]);
    assert!(svg.starts_with("<svg") && svg.contains("1543") && svg.contains("1188"));
}

#[test]
fn bson_files_and_json_lines_are_read_too() {
    let docs = fixture("seed002-metrics.json");
    let dir = std::env::temp_dir().join(format!("laconic-analyze-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bson_path = dir.join("dump.bson");
    let mut bytes = Vec::new();
    for _ in 0..3 {
        bytes.extend_from_slice(docs[0].as_bytes());
    }
    std::fs::write(&bson_path, bytes).unwrap();
    assert_eq!(read_file(&bson_path).unwrap().len(), 3);
    let lines = dir.join("export.json");
    std::fs::write(&lines, "{\"a\": 1}\n{\"b\": {\"$numberLong\": \"2\"}}\n").unwrap();
    assert_eq!(read_file(&lines).unwrap().len(), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}
