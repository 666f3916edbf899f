//! Pictures of `hcomm_perf` results: bus bandwidth against message size on log-log axes, as
//! SVG written here (a few hundred lines instead of a drawing library and its fonts).
//!
//! A plotting crate was measured as the writer: plotters 0.3 with its SVG backend builds in
//! 17 s here, but its SVG is a flat list of lines, polylines and texts, without a group, a
//! class or a data attribute (a two-curve chart: 16 KB, no `<g>`, no `data-`), so it cannot
//! write the curve groups below that scripts and the tests read.
//!
//! The picture has one panel per operation and one curve per (source, algorithm) in it: this
//! run's curves solid with filled markers, the peers' dashed with open ones. Every curve is a
//! `<g class="curve">` carrying `data-collective`, `data-source` and `data-algo` (empty when
//! the results name no algorithm), so scripts and tests can find them.
//!
//! Peers' results come from [`read_peer`]: `hcomm_perf -J` JSON, or the text tables of
//! `bench/mpi_bench.c` (also inside the `bench/results/*_summary.txt` files).

use std::fmt::Write as _;

use serde::Deserialize;

/// The source name of the measuring run's own curves.
pub const THIS_RUN: &str = "hcomm";

/// One curve: bus bandwidth at each message size.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    /// The operation (`allreduce`, `pingpong`, ...): one panel per operation.
    pub collective: String,
    /// Whose results: [`THIS_RUN`] or a peer's name.
    pub source: String,
    /// The algorithm, where the results name one (`auto`: hcomm's choice per size).
    pub algo: Option<String>,
    /// Whether the curve is a peer's (drawn dashed, with open markers).
    pub peer: bool,
    /// (size in bytes, bus bandwidth in GB/s), smallest size first.
    pub points: Vec<(f64, f64)>,
}

impl Curve {
    /// The legend's words: the source, then the algorithm if any.
    pub fn label(&self) -> String {
        match &self.algo {
            Some(a) => format!("{} {a}", self.source),
            None => self.source.clone(),
        }
    }
}

/// One measured point: (operation, algorithm, size in bytes, bus bandwidth in GB/s).
pub type Point<'a> = (&'a str, Option<&'a str>, f64, f64);

/// Groups points into curves per (operation, algorithm), in the order they first appear.
pub fn curves<'a>(
    points: impl IntoIterator<Item = Point<'a>>,
    source: &str,
    peer: bool,
) -> Vec<Curve> {
    let mut out: Vec<Curve> = Vec::new();
    for (collective, algo, size, busbw) in points {
        let at = out
            .iter()
            .position(|c| c.collective == collective && c.algo.as_deref() == algo);
        let curve = match at {
            Some(i) => &mut out[i],
            None => {
                out.push(Curve {
                    collective: collective.to_string(),
                    source: source.to_string(),
                    algo: algo.map(str::to_string),
                    peer,
                    points: Vec::new(),
                });
                out.last_mut().expect("just pushed")
            }
        };
        curve.points.push((size, busbw));
    }
    for c in &mut out {
        c.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// One row of `hcomm_perf -J` as a peer's file is read: the keys a plot needs.
#[derive(Debug, Deserialize)]
struct JsonRow {
    collective: String,
    size: f64,
    busbw: f64,
    /// The row's curve (written since plots exist; older files have none).
    #[serde(default)]
    curve: Option<String>,
}

/// Reads a peer's results: `hcomm_perf -J` JSON (a list of rows) or the text output of
/// `mpi_bench` (`# op: NAME` sections of `size count type time_us algbw busbw ...` lines;
/// `bcast` becomes `broadcast`). The curves get `name` as their source.
pub fn read_peer(name: &str, text: &str) -> Result<Vec<Curve>, String> {
    if text.trim_start().starts_with('[') {
        let rows: Vec<JsonRow> =
            serde_json::from_str(text).map_err(|e| format!("not hcomm_perf -J output: {e}"))?;
        let points = rows
            .iter()
            .map(|r| (r.collective.as_str(), r.curve.as_deref(), r.size, r.busbw));
        return Ok(curves(points, name, true));
    }
    // (op, ranks) of the table being read; rows as (op, ranks, size, busbw).
    let mut table: Option<(String, String)> = None;
    let mut rows: Vec<(String, String, f64, f64)> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("# op:") {
            let mut words = rest.split_whitespace();
            let op = match words.next() {
                Some("bcast") => "broadcast",
                Some(other) => other,
                None => continue,
            };
            let ranks = match (words.next(), words.next()) {
                (Some("nranks:"), Some(n)) => n,
                _ => "?",
            };
            table = Some((op.to_string(), ranks.to_string()));
            continue;
        }
        // Another tool's section (the summary files hold several) ends the op's table.
        if t.starts_with("# ----") || t.starts_with("# mpi_bench") || t.starts_with("# hcomm") {
            table = None;
            continue;
        }
        // mpi_bench's rows: size count "float" time_us algbw busbw #wrong avg_us min_us iters.
        let Some((op, ranks)) = &table else { continue };
        let f: Vec<&str> = t.split_whitespace().collect();
        if f.len() != 10 || f[2] != "float" {
            continue;
        }
        if let (Ok(size), Ok(busbw)) = (f[0].parse::<f64>(), f[5].parse::<f64>()) {
            rows.push((op.clone(), ranks.clone(), size, busbw));
        }
    }
    if rows.is_empty() {
        return Err(
            "neither hcomm_perf -J JSON nor mpi_bench output (no '# op:' table found)".into(),
        );
    }
    // An op measured at several rank counts (the summary files do that) gets a curve per
    // count, named by it; otherwise the curve has no algorithm name.
    let labels: Vec<Option<String>> = rows
        .iter()
        .map(|(op, ranks, _, _)| {
            let several = rows.iter().any(|(o, r, _, _)| o == op && r != ranks);
            several.then(|| format!("{ranks} ranks"))
        })
        .collect();
    let points = rows
        .iter()
        .zip(&labels)
        .map(|((o, _, s, b), l)| (o.as_str(), l.as_deref(), *s, *b));
    Ok(curves(points, name, true))
}

/// Width and height of one panel, pixels.
const PANEL_W: f64 = 800.0;
const PANEL_H: f64 = 400.0;
/// The plot area inside a panel: margins left, top, bottom; the legend takes the right.
const LEFT: f64 = 72.0;
const TOP: f64 = 36.0;
const BOTTOM: f64 = 52.0;
const LEGEND_W: f64 = 250.0;
/// Height of the picture's title line.
const TITLE_H: f64 = 40.0;
/// Distinguishable colours (Tableau 10), taken in turn by the curves of a panel.
const COLORS: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

/// Escapes text for XML content and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Not allowed in XML 1.0 at all.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// A byte count as a tick label: 8, 512, 4K, 16M, 1G (powers of 1024).
fn size_label(exp2: i32) -> String {
    const UNITS: [&str; 5] = ["", "K", "M", "G", "T"];
    let unit = usize::try_from(exp2.max(0) / 10)
        .unwrap_or(0)
        .min(UNITS.len() - 1);
    let rest = exp2 - 10 * unit as i32;
    format!("{}{}", 2f64.powi(rest), UNITS[unit])
}

/// A power of ten as a tick label: 0.001, 0.1, 1, 100.
fn decade_label(exp10: i32) -> String {
    let digits = usize::try_from(-exp10).unwrap_or(0);
    format!("{:.*}", digits, 10f64.powi(exp10))
}

/// Log-scale range of positive values: whole exponents of `base` around them.
fn log_range(values: impl Iterator<Item = f64>, base: f64, default: (i32, i32)) -> (i32, i32) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| *v > 0.0 && v.is_finite()) {
        let e = v.log(base);
        lo = lo.min(e);
        hi = hi.max(e);
    }
    if !lo.is_finite() {
        return default;
    }
    // Rounding guards against 1023.9999 for 1024.
    let lo = (lo + 1e-9).floor() as i32;
    let hi = ((hi - 1e-9).ceil() as i32).max(lo + 1);
    (lo, hi)
}

/// One panel: the curves of one operation, with the panel's top left corner at (x0, y0).
fn panel(svg: &mut String, x0: f64, y0: f64, collective: &str, curves: &[&Curve]) {
    let w = PANEL_W - LEFT - LEGEND_W;
    let h = PANEL_H - TOP - BOTTOM;
    let (px, py) = (x0 + LEFT, y0 + TOP);
    let points = || curves.iter().flat_map(|c| c.points.iter());
    let (xlo, xhi) = log_range(points().map(|p| p.0), 2.0, (3, 27));
    let (ylo, yhi) = log_range(points().map(|p| p.1), 10.0, (-3, 1));
    let x = |size: f64| px + (size.log2() - f64::from(xlo)) / f64::from(xhi - xlo) * w;
    let y = |bw: f64| py + h - (bw.log10() - f64::from(ylo)) / f64::from(yhi - ylo) * h;

    let _ = writeln!(
        svg,
        r#"<g class="panel" data-collective="{c}">"#,
        c = esc(collective)
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" class="panel-title">{}</text>"#,
        px + w / 2.0,
        y0 + 22.0,
        esc(collective)
    );
    let _ = writeln!(
        svg,
        r##"<rect x="{px:.1}" y="{py:.1}" width="{w:.1}" height="{h:.1}" fill="#ffffff" stroke="#444444"/>"##
    );
    // X ticks: powers of 2, at most about 9 labelled.
    let step = usize::try_from((xhi - xlo + 7) / 8).unwrap_or(1).max(1);
    for e in (xlo..=xhi).step_by(step) {
        let gx = x(2f64.powi(e));
        let _ = writeln!(
            svg,
            r#"<line x1="{gx:.1}" y1="{py:.1}" x2="{gx:.1}" y2="{:.1}" class="grid"/>"#,
            py + h
        );
        let _ = writeln!(
            svg,
            r#"<text x="{gx:.1}" y="{:.1}" class="tick" text-anchor="middle">{}</text>"#,
            py + h + 16.0,
            size_label(e)
        );
    }
    for e in ylo..=yhi {
        let gy = y(10f64.powi(e));
        let _ = writeln!(
            svg,
            r#"<line x1="{px:.1}" y1="{gy:.1}" x2="{:.1}" y2="{gy:.1}" class="grid"/>"#,
            px + w
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" class="tick" text-anchor="end">{}</text>"#,
            px - 6.0,
            gy + 4.0,
            decade_label(e)
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" class="axis" text-anchor="middle">message size (bytes)</text>"#,
        px + w / 2.0,
        py + h + 38.0
    );
    let (ax, ay) = (x0 + 18.0, py + h / 2.0);
    let _ = writeln!(
        svg,
        r#"<text x="{ax:.1}" y="{ay:.1}" class="axis" text-anchor="middle" transform="rotate(-90 {ax:.1} {ay:.1})">busbw (GB/s)</text>"#
    );

    for (i, c) in curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let dash = if c.peer {
            r#" stroke-dasharray="7 4""#
        } else {
            ""
        };
        let _ = writeln!(
            svg,
            r#"<g class="curve" data-collective="{}" data-source="{}" data-algo="{}">"#,
            esc(&c.collective),
            esc(&c.source),
            esc(c.algo.as_deref().unwrap_or(""))
        );
        let _ = writeln!(
            svg,
            "<title>{} {}</title>",
            esc(collective),
            esc(&c.label())
        );
        let shown: Vec<(f64, f64)> = c
            .points
            .iter()
            .filter(|(s, b)| *s > 0.0 && *b > 0.0 && s.is_finite() && b.is_finite())
            .map(|&(s, b)| (x(s), y(b)))
            .collect();
        if !shown.is_empty() {
            let pts: Vec<String> = shown
                .iter()
                .map(|(a, b)| format!("{a:.1},{b:.1}"))
                .collect();
            let _ = writeln!(
                svg,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="1.8"{dash}/>"#,
                pts.join(" ")
            );
        }
        let fill = if c.peer { "#ffffff" } else { color };
        for (a, b) in &shown {
            let _ = writeln!(
                svg,
                r#"<circle cx="{a:.1}" cy="{b:.1}" r="2.8" fill="{fill}" stroke="{color}"/>"#
            );
        }
        // The legend entry.
        let lx = px + w + 16.0;
        let ly = py + 10.0 + 18.0 * i as f64;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="1.8"{dash}/>"#,
            lx + 26.0
        );
        let _ = writeln!(
            svg,
            r#"<circle cx="{:.1}" cy="{ly:.1}" r="2.8" fill="{fill}" stroke="{color}"/>"#,
            lx + 13.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" class="legend">{}</text>"#,
            lx + 32.0,
            ly + 4.0,
            esc(&c.label())
        );
        let _ = writeln!(svg, "</g>");
    }
    let _ = writeln!(svg, "</g>");
}

/// The SVG document: `title` on top, then one panel per operation (in the order the curves
/// first name them), two panels a row.
pub fn svg(title: &str, curves: &[Curve]) -> String {
    let mut ops: Vec<&str> = Vec::new();
    for c in curves {
        if !ops.contains(&c.collective.as_str()) {
            ops.push(&c.collective);
        }
    }
    let cols = if ops.len() > 1 { 2 } else { 1 };
    let rows = ops.len().div_ceil(cols).max(1);
    let width = PANEL_W * cols as f64;
    let height = TITLE_H + PANEL_H * rows as f64;
    let mut out = String::new();
    let _ = writeln!(out, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">"#
    );
    let _ = writeln!(out, "<title>{}</title>", esc(title));
    let _ = writeln!(
        out,
        "<style>text {{ font-family: sans-serif; fill: #222222; }} \
         .title {{ font-size: 16px; font-weight: bold; }} \
         .panel-title {{ font-size: 14px; font-weight: bold; text-anchor: middle; }} \
         .tick {{ font-size: 11px; }} .axis {{ font-size: 12px; }} .legend {{ font-size: 12px; }} \
         .grid {{ stroke: #dddddd; stroke-width: 1; }}</style>"
    );
    let _ = writeln!(
        out,
        r##"<rect x="0" y="0" width="{width}" height="{height}" fill="#fafafa"/>"##
    );
    let _ = writeln!(
        out,
        r#"<text x="16" y="26" class="title">{}</text>"#,
        esc(title)
    );
    for (i, op) in ops.iter().enumerate() {
        let x0 = PANEL_W * (i % cols) as f64;
        let y0 = TITLE_H + PANEL_H * (i / cols) as f64;
        let mine: Vec<&Curve> = curves.iter().filter(|c| c.collective == *op).collect();
        panel(&mut out, x0, y0, op, &mine);
    }
    let _ = writeln!(out, "</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_group_into_curves_in_order() {
        let c = curves(
            [
                ("allreduce", Some("ring"), 16.0, 0.2),
                ("allreduce", Some("tree"), 8.0, 0.1),
                ("allreduce", Some("ring"), 8.0, 0.1),
                ("broadcast", Some("ring"), 8.0, 0.3),
            ],
            THIS_RUN,
            false,
        );
        let names: Vec<(String, String)> = c
            .iter()
            .map(|c| (c.collective.clone(), c.label()))
            .collect();
        assert_eq!(
            names,
            [
                ("allreduce".into(), "hcomm ring".into()),
                ("allreduce".into(), "hcomm tree".into()),
                ("broadcast".into(), "hcomm ring".into())
            ]
        );
        assert_eq!(c[0].points, [(8.0, 0.1), (16.0, 0.2)]);
    }

    #[test]
    fn mpi_bench_text_is_read_by_op() {
        let text = "\
# ---- hcomm_perf allreduce ----
  8 2 float32 sum - 4.11 0.002 0.002 0 recursive_doubling
# ---- Open MPI mpi_bench ompi (btl tcp,self) ----
# mpi_bench  library: Open MPI v4.1.4
#
# op: allreduce   nranks: 2   (time_us = median; algbw/busbw in GB/s)
#         size        count   type      time_us     algbw     busbw  #wrong       avg_us       min_us    iters
             8            2  float         4.69     0.002     0.002       0         4.84         1.62    40551
         65536        16384  float        30.76     2.130     2.130       0        32.31        25.05     6689
#
# op: bcast   nranks: 2   (time_us = median; algbw/busbw in GB/s)
             8            2  float         2.27     0.004     0.005       0         2.46         0.43    85282
";
        let c = read_peer("ompi", text).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(
            (c[0].collective.as_str(), c[0].label()),
            ("allreduce", "ompi".into())
        );
        assert_eq!(c[0].points, [(8.0, 0.002), (65536.0, 2.13)]);
        assert_eq!(c[1].collective, "broadcast");
        assert_eq!(c[1].points, [(8.0, 0.005)]);
        assert!(c.iter().all(|c| c.peer && c.algo.is_none()));
        assert!(read_peer("x", "nothing here\n").is_err());
        // The same op at two rank counts: a curve each.
        let two = format!("{text}# op: allreduce   nranks: 8\n 8 2 float 9 0.001 0.0015 0 9 9 5\n");
        let c = read_peer("ompi", &two).unwrap();
        let labels: Vec<(&str, String)> = c
            .iter()
            .map(|c| (c.collective.as_str(), c.label()))
            .collect();
        assert_eq!(
            labels,
            [
                ("allreduce", "ompi 2 ranks".to_string()),
                ("broadcast", "ompi".to_string()),
                ("allreduce", "ompi 8 ranks".to_string())
            ]
        );
    }

    #[test]
    fn hcomm_perf_json_is_read_by_curve() {
        let json = r#"[
          {"collective":"allreduce","size":8,"count":2,"type":"float32","redop":"sum",
           "root":null,"time_us":4.0,"algbw":0.002,"busbw":0.002,"wrong":0,
           "algo":"ring","curve":"ring"},
          {"collective":"allreduce","size":16,"busbw":0.004,"algo":"tree","curve":"tree"},
          {"collective":"pingpong","size":8,"busbw":0.5}
        ]"#;
        let c = read_peer("base", json).unwrap();
        let labels: Vec<String> = c.iter().map(Curve::label).collect();
        assert_eq!(labels, ["base ring", "base tree", "base"]);
        assert!(read_peer("x", "[{\"size\": 1}]").is_err());
    }

    #[test]
    fn ticks_and_ranges() {
        assert_eq!(size_label(3), "8");
        assert_eq!(size_label(10), "1K");
        assert_eq!(size_label(14), "16K");
        assert_eq!(size_label(27), "128M");
        assert_eq!(size_label(30), "1G");
        assert_eq!(decade_label(-3), "0.001");
        assert_eq!(decade_label(0), "1");
        assert_eq!(decade_label(2), "100");
        assert_eq!(log_range([8.0, 1024.0].into_iter(), 2.0, (0, 1)), (3, 10));
        assert_eq!(log_range([5.0].into_iter(), 2.0, (0, 1)), (2, 3));
        assert_eq!(log_range([0.0, -1.0].into_iter(), 10.0, (-3, 1)), (-3, 1));
        assert_eq!(log_range([0.002, 3.5].into_iter(), 10.0, (0, 1)), (-3, 1));
    }

    #[test]
    fn the_svg_is_well_formed_with_a_group_per_curve() {
        let mut all = curves(
            [
                ("allreduce", Some("ring"), 8.0, 0.001),
                ("allreduce", Some("ring"), 1048576.0, 2.5),
                ("allreduce", Some("tree"), 8.0, 0.0),
                ("broadcast", Some("auto"), 64.0, 0.01),
            ],
            THIS_RUN,
            false,
        );
        all.extend(
            read_peer(
                "<peer & co>",
                "# op: bcast\n 64 16 float 1 1 0.02 0 1 1 5\n",
            )
            .unwrap(),
        );
        let text = svg("title with <angle> & \"quotes\"", &all);
        let doc = roxmltree::Document::parse(&text).expect("well-formed XML");
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        assert_eq!(
            root.tag_name().namespace(),
            Some("http://www.w3.org/2000/svg")
        );
        let groups: Vec<(String, String, String)> = root
            .descendants()
            .filter(|n| n.attribute("class") == Some("curve"))
            .map(|n| {
                let a = |k| n.attribute(k).unwrap_or("?").to_string();
                (a("data-collective"), a("data-source"), a("data-algo"))
            })
            .collect();
        let want = [
            ("allreduce", "hcomm", "ring"),
            ("allreduce", "hcomm", "tree"),
            ("broadcast", "hcomm", "auto"),
            ("broadcast", "<peer & co>", ""),
        ];
        let want: Vec<(String, String, String)> = want
            .iter()
            .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
            .collect();
        assert_eq!(groups, want);
        let panels = root
            .descendants()
            .filter(|n| n.attribute("class") == Some("panel"))
            .count();
        assert_eq!(panels, 2);
        // A curve without positive values keeps its group but draws nothing.
        let tree = root
            .descendants()
            .find(|n| n.attribute("data-algo") == Some("tree"))
            .unwrap();
        assert!(!tree.descendants().any(|n| n.has_tag_name("polyline")));
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(esc(r#"a<b>&"c'"#), "a&lt;b&gt;&amp;&quot;c&apos;");
        assert_eq!(esc("x\u{1}y"), "x y");
    }
}
