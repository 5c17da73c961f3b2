//! Latency-distribution charts as standalone SVG files (`--svg`, and `chart` to overlay
//! several reports).
//!
//! The x axis is the percentile on the usual "nines" scale (position = -log10(1 - q)), so
//! p50, p90, p99 and p99.9 are evenly spaced; the y axis is latency in milliseconds on a
//! log scale. Written by hand rather than with a plotting crate: the one chart we need is
//! a few polylines, and plotters would need fontconfig on the host for its text layout.

use std::fmt::Write;

/// One curve: a label and (quantile 0..=1, latency ms) points, quantiles ascending.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Quantiles sampled into a report's latency curve.
pub const QUANTILES: [f64; 16] = [
    0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999, 0.99995, 0.99999,
    0.999_999, 1.0,
];

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 520.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
/// Highest "nines" shown: 99.9999%.
const MAX_NINES: f64 = 6.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// Render `series` as an SVG document.
pub fn render(title: &str, series: &[Series]) -> String {
    let nines = |q: f64| (-(1.0 - q).max(1e-6).log10()).clamp(0.0, MAX_NINES);
    let all = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let (lo, hi) = all
        .filter(|v| *v > 0.0)
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if lo > hi { (0.1, 1.0) } else { (lo, hi) };
    let y_lo = 10f64.powf(lo.log10().floor());
    let y_hi = 10f64.powf(hi.log10().ceil().max(y_lo.log10() + 1.0));
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |q: f64| LEFT + nines(q) / MAX_NINES * plot_w;
    let y = |ms: f64| {
        let v = ms.max(y_lo).log10();
        TOP + plot_h - (v - y_lo.log10()) / (y_hi.log10() - y_lo.log10()) * plot_h
    };

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="28" font-size="16" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        escape(title)
    );
    // Grid and axis labels.
    for (i, label) in ["0", "90", "99", "99.9", "99.99", "99.999", "99.9999"]
        .iter()
        .enumerate()
    {
        let gx = LEFT + i as f64 / MAX_NINES * plot_w;
        let _ = writeln!(
            s,
            r##"<line x1="{gx:.1}" y1="{TOP}" x2="{gx:.1}" y2="{:.1}" stroke="#ddd"/>"##,
            TOP + plot_h
        );
        let _ = writeln!(
            s,
            r#"<text x="{gx:.1}" y="{:.1}" text-anchor="middle">{label}</text>"#,
            TOP + plot_h + 18.0
        );
    }
    let mut decade = y_lo;
    while decade <= y_hi * 1.0001 {
        let gy = y(decade);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{gy:.1}" x2="{:.1}" y2="{gy:.1}" stroke="#ddd"/>"##,
            LEFT + plot_w
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            gy + 4.0,
            format_ms(decade)
        );
        decade *= 10.0;
    }
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">percentile</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 18.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(22 {:.1}) rotate(-90)" text-anchor="middle">latency (ms, log scale)</text>"#,
        TOP + plot_h / 2.0
    );
    // Curves and legend.
    for (i, series) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = series
            .points
            .iter()
            .map(|&(q, ms)| format!("{:.1},{:.1}", x(q), y(ms)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        let ly = TOP + 10.0 + 20.0 * i as f64;
        let lx = LEFT + plot_w + 15.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="3"/>"#,
            lx + 20.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}">{}</text>"#,
            lx + 26.0,
            ly + 4.0,
            escape(&series.label)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn format_ms(ms: f64) -> String {
    if ms >= 1.0 {
        format!("{ms:.0}")
    } else {
        format!("{ms}")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_series_on_a_log_scale() {
        let a = Series {
            label: "ours <fast>".into(),
            points: vec![(0.0, 0.2), (0.5, 1.0), (0.99, 4.0), (1.0, 9.0)],
        };
        let b = Series {
            label: "peer".into(),
            points: vec![(0.0, 1.0), (0.5, 10.0), (0.99, 60.0), (1.0, 200.0)],
        };
        let svg = render("write & read", &[a, b]);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("ours &lt;fast&gt;") && svg.contains("write &amp; read"));
        // Decades from 0.1 ms to 1000 ms are labelled.
        for label in [">0.1<", ">1<", ">10<", ">100<", ">1000<"] {
            assert!(svg.contains(label), "missing {label}");
        }
        // Higher latency is drawn higher up (smaller y).
        let y = |ms: f64| {
            let svg = render(
                "t",
                &[Series {
                    label: "x".into(),
                    points: vec![(0.5, ms), (0.6, 1000.0), (0.7, 0.1)],
                }],
            );
            let pts = svg.split("points=\"").nth(1).expect("points").to_string();
            let first = pts.split(' ').next().expect("point").to_string();
            first
                .split(',')
                .nth(1)
                .expect("y")
                .parse::<f64>()
                .expect("number")
        };
        assert!(y(100.0) < y(1.0));
    }
}
