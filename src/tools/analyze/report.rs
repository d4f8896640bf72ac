//! The analyser's output: the seed's text layout and an SVG bar chart.

use std::fmt::Write;

use super::{Analysis, Breakdown};

const RULE: &str = "+----------------------------------------------+";

/// One breakdown in seed 002's layout.
pub fn text(label: &str, b: &Breakdown) -> String {
    let mut out = String::new();
    let types = |out: &mut String| {
        for (t, n) in &b.data_by_type {
            let _ = writeln!(out, "\t {t}: {n}B");
        }
    };
    let _ = writeln!(out, "{label}");
    let _ = writeln!(out, "{RULE}");
    let _ = writeln!(out, "data size by type (total): {}B", b.data());
    types(&mut out);
    let _ = writeln!(out, "binary type markers (total): {}B", b.binary_markers);
    let _ = writeln!(out, "{RULE}");
    let _ = writeln!(out, "attribute (total): {}B", b.attributes);
    let _ = writeln!(out, "null terminators: {}B", b.null_terminators);
    let _ = writeln!(out, "{RULE}");
    let _ = writeln!(
        out,
        "document lengths (total): {}B",
        b.document_lengths_total()
    );
    for (k, n) in &b.document_lengths {
        let _ = writeln!(out, "\t{k}: {n}B");
    }
    let _ = writeln!(out, "{RULE}");
    let _ = writeln!(out, "data (total): {}B", b.data());
    for (k, n) in &b.data_by_attribute {
        let _ = writeln!(out, "\t{k}: {n}B");
    }
    let _ = writeln!(out, "\t-------------------------------------------+");
    for (t, n) in &b.data_by_type {
        let _ = writeln!(out, "\t{t}: {n}B");
    }
    let _ = writeln!(out, "{RULE}");
    let _ = writeln!(out, "document size (total): {}B", b.total);
    let _ = writeln!(out, "Overhead: {:.2}%", b.overhead());
    out
}

/// The saving tokenization would bring, after both breakdowns.
pub fn saving(a: &Analysis) -> String {
    format!(
        "{}: {} documents, {}B → {}B stored with Laconic: {:.1}B saved per document, {:.2}% smaller ({} names and {} values in the dictionary, stored once per database)\n",
        a.label,
        a.logical.documents,
        a.logical.total,
        a.tokenized.total,
        a.saved_per_document(),
        a.saved_percent(),
        a.dictionary_names,
        a.dictionary_values,
    )
}

/// A bar chart of the average document size of each variant, largest
/// first (as the seed's "BSON Chart"), each bar split into data and
/// overhead.
pub fn chart_svg(variants: &[(String, &Breakdown)]) -> String {
    let mut bars: Vec<(String, f64, f64)> = variants
        .iter()
        .map(|(label, b)| {
            let docs = b.documents.max(1) as f64;
            (label.clone(), b.total as f64 / docs, b.data() as f64 / docs)
        })
        .collect();
    bars.sort_by(|a, b| b.1.total_cmp(&a.1));
    let max = bars.iter().map(|b| b.1).fold(1.0, f64::max);
    let (bar_w, gap, height, top, left) = (60.0, 30.0, 320.0, 30.0, 60.0);
    let width = left + bars.len() as f64 * (bar_w + gap) + gap;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{}" font-family="sans-serif" font-size="11">"##,
        height + top + 90.0
    );
    let _ = writeln!(
        svg,
        r##"<text x="{left}" y="18" font-size="14">BSON document size (bytes per document)</text>"##
    );
    for (i, (label, total, data)) in bars.iter().enumerate() {
        let x = left + gap + i as f64 * (bar_w + gap);
        let h = total / max * height;
        let hd = data / max * height;
        let y = top + height - h;
        let _ = writeln!(
            svg,
            r##"<rect x="{x}" y="{y:.1}" width="{bar_w}" height="{:.1}" fill="#d9822b"><title>overhead {:.0} B</title></rect>"##,
            h - hd,
            total - data
        );
        let _ = writeln!(
            svg,
            r##"<rect x="{x}" y="{:.1}" width="{bar_w}" height="{hd:.1}" fill="#2b6cd9"><title>data {data:.0} B</title></rect>"##,
            y + h - hd
        );
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{total:.0}</text>"##,
            x + bar_w / 2.0,
            y - 4.0
        );
        let _ = writeln!(
            svg,
            r##"<text transform="translate({:.1},{:.1}) rotate(40)">{}</text>"##,
            x + 8.0,
            top + height + 14.0,
            escape(label)
        );
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{left}" y="{}" width="10" height="10" fill="#2b6cd9"/><text x="{}" y="{}">data</text>"##,
        height + top + 75.0,
        left + 14.0,
        height + top + 84.0
    );
    let _ = writeln!(
        svg,
        r##"<rect x="{}" y="{}" width="10" height="10" fill="#d9822b"/><text x="{}" y="{}">overhead</text>"##,
        left + 60.0,
        height + top + 75.0,
        left + 74.0,
        height + top + 84.0
    );
    svg.push_str("</svg>\n");
    svg
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
