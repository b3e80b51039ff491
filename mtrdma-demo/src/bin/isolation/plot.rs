//! Pictures of the isolation demo's results: SVG and PNG (plotters).
//!
//! Every chart is drawn once by a generic function over
//! `DrawingArea<DB, Shift>` and rendered to both backends. Text in the PNG is
//! rasterised with `ab_glyph` from a TTF read at run time (DejaVu Sans, from
//! the Debian package `fonts-dejavu-core`, or the file named by the
//! `MTRDMA_FONT` environment variable); the SVG uses the same font metrics for
//! its layout and leaves the glyphs to the viewer.

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::{CoordTranslate, Shift};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{register_font, FontStyle, RGBColor};

mod bars;
use bars::Bars;

/// One curve of latency samples, in microseconds (unsorted).
pub(crate) struct LatencySeries {
    /// Legend text.
    pub(crate) label: String,
    /// Latency samples in microseconds, in any order.
    pub(crate) samples_us: Vec<f64>,
}

/// One tenant's throughput over time: (seconds since start, MB/s) points.
pub(crate) struct RateSeries {
    /// Legend text.
    pub(crate) label: String,
    /// (seconds since start, rate) points.
    pub(crate) points: Vec<(f64, f64)>,
}

/// One group of bars: a label on the x axis and one value per way.
pub(crate) struct BarGroup {
    /// Text under the group on the x axis.
    pub(crate) label: String,
    /// One value per way, in the order of the `ways` names.
    pub(crate) values: Vec<f64>,
}

/// Draws latency CDFs (x: latency in us, log scale; y: fraction 0..1, with
/// the p50/p99/p99.9 levels marked by faint horizontal lines) to
/// `<stem>.svg` and `<stem>.png`.
///
/// Non-finite samples are ignored; zero or negative ones are drawn at the
/// smallest positive sample of all series (1 ns if there is none). The legend
/// gives each curve's p50, p99 and, over at least 10,000 samples, p99.9
/// (nearest rank, unclamped samples).
pub(crate) fn latency_cdf(
    stem: &std::path::Path,
    title: &str,
    series: &[LatencySeries],
) -> Result<(), String> {
    let cdf = Cdf::new(title, series);
    render(stem, &Picture::Cdf(cdf))
}

/// Draws throughput over time, one line per series, to `<stem>.svg` and `<stem>.png`.
pub(crate) fn rates_over_time(
    stem: &std::path::Path,
    title: &str,
    y_label: &str,
    series: &[RateSeries],
) -> Result<(), String> {
    let rates = Rates::new(title, y_label, series);
    render(stem, &Picture::Rates(rates))
}

/// Grouped bar chart: one group per `BarGroup`, one bar per way (`ways`
/// names the bars, same order as `values`), to `<stem>.svg` and `<stem>.png`.
pub(crate) fn grouped_bars(
    stem: &std::path::Path,
    title: &str,
    y_label: &str,
    ways: &[&str],
    groups: &[BarGroup],
) -> Result<(), String> {
    let bars = Bars::new(title, y_label, ways, groups);
    render(stem, &Picture::Bars(bars))
}

/// Picture size in pixels (the SVG uses the same user units).
const SIZE: (u32, u32) = (960, 600);

/// Font family name the TTF is registered under and every text style uses.
const FAMILY: &str = "sans-serif";

/// Font read when `MTRDMA_FONT` is not set.
const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Colours by series index: green, red, blue (alone, unprotected, mtrdma),
/// then the rest of the tab10 palette.
const PALETTE: [RGBColor; 10] = [
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// The fixed colour of series number `i`.
fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Colour of the major grid lines.
const GRID_BOLD: RGBColor = RGBColor(215, 215, 215);
/// Colour of the minor grid lines.
const GRID_LIGHT: RGBColor = RGBColor(238, 238, 238);
/// Colour of annotations (percentile levels, "no data").
const NOTE: RGBColor = RGBColor(110, 110, 110);

/// Reads the TTF and registers it with plotters, once per process.
fn ensure_font() -> Result<(), String> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let path = std::env::var_os("MTRDMA_FONT")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_FONT));
        let bytes = std::fs::read(&path).map_err(|e| {
            format!(
                "cannot read font {}: {e} (install the Debian package fonts-dejavu-core, \
                 or set MTRDMA_FONT to a TrueType font file)",
                path.display()
            )
        })?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        register_font(FAMILY, FontStyle::Normal, bytes).map_err(|_| {
            format!(
                "{} is not a usable TrueType/OpenType font (install the Debian package \
                 fonts-dejavu-core, or set MTRDMA_FONT to a TrueType font file)",
                path.display()
            )
        })
    })
    .clone()
}

/// `<stem>.<ext>`, keeping any dots already in the stem.
fn with_suffix(stem: &Path, ext: &str) -> PathBuf {
    let mut s = stem.as_os_str().to_owned();
    s.push(".");
    s.push(ext);
    PathBuf::from(s)
}

/// Turns a plotters error into text.
/// Draws a chart's mesh (`chart.configure_mesh()` and the chart's own
/// settings) in the pictures' grid and label style.
macro_rules! draw_mesh {
    ($mesh:expr) => {
        $mesh
            .bold_line_style(GRID_BOLD)
            .light_line_style(GRID_LIGHT)
            .axis_desc_style(axis_desc_style())
            .label_style(tick_style())
            .draw()
            .map_err(err)
    };
}

fn err<E: Display>(e: E) -> String {
    e.to_string()
}

/// Draws `picture` to `<stem>.svg`, then to `<stem>.png`.
fn render(stem: &Path, picture: &Picture<'_>) -> Result<(), String> {
    ensure_font()?;

    let svg = with_suffix(stem, "svg");
    {
        let root = SVGBackend::new(&svg, SIZE).into_drawing_area();
        picture
            .draw(&root)
            .and_then(|()| root.present().map_err(err))
            .map_err(|e| format!("{}: {e}", svg.display()))?;
    }

    let png = with_suffix(stem, "png");
    let root = BitMapBackend::new(&png, SIZE).into_drawing_area();
    picture
        .draw(&root)
        .and_then(|()| root.present().map_err(err))
        .map_err(|e| format!("{}: {e}", png.display()))
}

/// A chart, with its data already cleaned, ready to draw on any backend.
enum Picture<'a> {
    /// Latency CDFs.
    Cdf(Cdf<'a>),
    /// Rates over time.
    Rates(Rates<'a>),
    /// Grouped bars.
    Bars(Bars<'a>),
}

impl Picture<'_> {
    /// Draws the chart on `root` (the whole picture).
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        root.fill(&WHITE).map_err(err)?;
        match self {
            Picture::Cdf(c) => c.draw(root),
            Picture::Rates(r) => r.draw(root),
            Picture::Bars(b) => b.draw(root),
        }
    }
}

/// Title style.
/// The frame every chart shares: title, margins, axis label areas.
fn chart_builder<'a, 'b, DB: DrawingBackend>(
    root: &'a DrawingArea<DB, Shift>,
    title: &'b str,
    y_label_area: u32,
) -> ChartBuilder<'a, 'b, DB> {
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(title, title_style())
        .margin(15)
        .margin_top(10)
        .margin_right(25)
        .x_label_area_size(50)
        .y_label_area_size(y_label_area);
    builder
}

/// The legend every chart shares, at `position`.
fn draw_legend<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> Result<(), String>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .position(position)
        .margin(12)
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(170, 170, 170))
        .label_font(legend_style())
        .draw()
        .map_err(err)
}

fn title_style() -> TextStyle<'static> {
    (FAMILY, 22).into_font().color(&BLACK)
}

/// Axis description style.
fn axis_desc_style() -> TextStyle<'static> {
    (FAMILY, 16).into_font().color(&BLACK)
}

/// Tick label style.
fn tick_style() -> TextStyle<'static> {
    (FAMILY, 14).into_font().color(&RGBColor(60, 60, 60))
}

/// Legend text style.
fn legend_style() -> TextStyle<'static> {
    (FAMILY, 14).into_font().color(&BLACK)
}

/// Small annotation style.
fn note_style() -> TextStyle<'static> {
    (FAMILY, 12).into_font().color(&NOTE)
}

/// Draws only the title and a centred "no data".
fn draw_no_data<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
) -> Result<(), String> {
    let area = root
        .margin(10, 10, 10, 10)
        .titled(title, title_style())
        .map_err(err)?;
    let (w, h) = area.dim_in_pixel();
    let style = (FAMILY, 28)
        .into_font()
        .color(&NOTE)
        .pos(Pos::new(HPos::Center, VPos::Center));
    area.draw(&Text::new("no data", (w as i32 / 2, h as i32 / 2), style))
        .map_err(err)
}

/// Short number: about three significant digits, no trailing zeros, k/M
/// suffixes for large values.
fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", fmt_num(v / 1e6))
    } else if a >= 1e4 {
        format!("{}k", fmt_num(v / 1e3))
    } else if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else {
        let decimals = if a >= 10.0 {
            1
        } else if a >= 1.0 {
            2
        } else {
            // Three significant digits below one.
            (2 - a.log10().floor() as i32).clamp(0, 9) as usize
        };
        trim_zeros(format!("{v:.decimals$}"))
    }
}

/// Tick label for a linear axis: exact enough for plotters' round tick values.
fn fmt_tick(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        fmt_num(v)
    } else if a < 1e-9 {
        "0".to_string()
    } else {
        trim_zeros(format!("{v:.4}"))
    }
}

/// Removes trailing zeros (and a trailing point) after a decimal point.
fn trim_zeros(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

// ---------------------------------------------------------------- CDF ----

/// Percentile levels marked on the CDF, with their names.
const LEVELS: [(f64, &str); 3] = [(0.5, "p50"), (0.99, "p99"), (0.999, "p99.9")];

/// One cleaned CDF curve.
struct CdfCurve<'a> {
    /// Index of the series in the caller's slice (for its colour).
    index: usize,
    /// Legend label.
    label: &'a str,
    /// Finite samples, sorted, not yet clamped.
    sorted: Vec<f64>,
}

/// A latency CDF chart with its data cleaned.
struct Cdf<'a> {
    /// Chart title.
    title: &'a str,
    /// Non-empty curves.
    curves: Vec<CdfCurve<'a>>,
    /// Value drawn in place of zero or negative samples.
    floor: f64,
}

impl<'a> Cdf<'a> {
    /// Cleans the caller's series.
    fn new(title: &'a str, series: &'a [LatencySeries]) -> Self {
        let curves: Vec<CdfCurve<'a>> = series
            .iter()
            .enumerate()
            .filter_map(|(index, s)| {
                let mut sorted: Vec<f64> = s
                    .samples_us
                    .iter()
                    .copied()
                    .filter(|v| v.is_finite())
                    .collect();
                if sorted.is_empty() {
                    return None;
                }
                sorted.sort_by(f64::total_cmp);
                Some(CdfCurve {
                    index,
                    label: &s.label,
                    sorted,
                })
            })
            .collect();
        let floor = curves
            .iter()
            .filter_map(|c| c.sorted.iter().copied().find(|v| *v > 0.0))
            .fold(f64::INFINITY, f64::min);
        let floor = if floor.is_finite() { floor } else { 1e-3 };
        Cdf {
            title,
            curves,
            floor,
        }
    }

    /// Nearest-rank percentile of a sorted slice (NaN for none).
    fn percentile(sorted: &[f64], p: f64) -> f64 {
        mtrdma::sched::stats::percentile(sorted, p).unwrap_or(f64::NAN)
    }

    /// Points of one curve, thinned to what the picture can show: a step
    /// line for few samples, else a line through the thinned steps' corners.
    fn steps(&self, sorted: &[f64], ln_span: f64) -> Vec<(f64, f64)> {
        let n = sorted.len();
        let stairs = n <= 500;
        let min_dx = ln_span / 2000.0;
        let min_dy = 1.0 / 1000.0;
        let mut out = Vec::with_capacity(n.min(8000) + 2);
        let mut last_x = sorted[0].max(self.floor);
        let mut last_y = 0.0;
        out.push((last_x, 0.0));
        for (i, &v) in sorted.iter().enumerate() {
            let x = v.max(self.floor);
            let y = (i + 1) as f64 / n as f64;
            let is_last = i + 1 == n;
            // Keep the last sample of each run of equal values.
            let next_same = !is_last && sorted[i + 1].max(self.floor) == x;
            if next_same {
                continue;
            }
            if is_last || (x.ln() - last_x.ln()) >= min_dx || (y - last_y) >= min_dy {
                if stairs {
                    out.push((x, last_y));
                }
                out.push((x, y));
                last_x = x;
                last_y = y;
            }
        }
        out
    }

    /// Draws the chart.
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        if self.curves.is_empty() {
            return draw_no_data(root, self.title);
        }
        let lo_data = self
            .curves
            .iter()
            .map(|c| c.sorted[0].max(self.floor))
            .fold(f64::INFINITY, f64::min);
        let hi_data = self
            .curves
            .iter()
            .map(|c| c.sorted[c.sorted.len() - 1].max(self.floor))
            .fold(0.0, f64::max);
        let lo = nice_floor(lo_data / 1.15);
        let hi = nice_ceil((hi_data * 1.15).min(1e300));
        let (bold, light) = log_ticks(lo, hi);

        let mut chart = chart_builder(root, self.title, 60)
            .build_cartesian_2d(
                (lo..hi)
                    .log_scale()
                    .with_key_points(bold)
                    .with_light_points(light),
                0.0..1.0_f64,
            )
            .map_err(err)?;
        draw_mesh!(chart
            .configure_mesh()
            .x_desc("latency (µs, log scale)")
            .y_desc("fraction of operations ≤ latency")
            .x_label_formatter(&|v| fmt_num(*v))
            .y_label_formatter(&|v| format!("{v:.1}"))
            .y_labels(11)
            .y_max_light_lines(1))?;

        // Percentile levels: faint lines with a small name at the left.
        let level_line = NOTE.mix(0.55).stroke_width(1);
        for (i, &(level, name)) in LEVELS.iter().enumerate() {
            chart
                .draw_series(LineSeries::new([(lo, level), (hi, level)], level_line))
                .map_err(err)?;
            // p50 above its line, p99 below, p99.9 above (just over the frame).
            let (dy, vpos) = if i == 1 {
                (3, VPos::Top)
            } else {
                (-3, VPos::Bottom)
            };
            let style = note_style().pos(Pos::new(HPos::Left, vpos));
            chart
                .plotting_area()
                .draw(&(EmptyElement::at((lo, level)) + Text::new(name, (5, dy), style)))
                .map_err(err)?;
        }

        let ln_span = hi.ln() - lo.ln();
        for c in &self.curves {
            let col = colour(c.index);
            // p99.9 only where the tables report it.
            let p999 = if c.sorted.len() >= crate::P999_MIN_SAMPLES {
                format!(" · p99.9 {}", fmt_num(Self::percentile(&c.sorted, 0.999)))
            } else {
                String::new()
            };
            let label = format!(
                "{}   p50 {} · p99 {}{p999} µs",
                c.label,
                fmt_num(Self::percentile(&c.sorted, 0.5)),
                fmt_num(Self::percentile(&c.sorted, 0.99)),
            );
            chart
                .draw_series(LineSeries::new(
                    self.steps(&c.sorted, ln_span),
                    col.stroke_width(2),
                ))
                .map_err(err)?
                .label(label)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], col.stroke_width(3)));
        }
        draw_legend(&mut chart, SeriesLabelPosition::LowerRight)
    }
}

/// Largest d·10^k (d in 1..=9) not above `v` (> 0).
fn nice_floor(v: f64) -> f64 {
    let e = 10f64.powf(v.log10().floor());
    let m = (v / e).floor().clamp(1.0, 9.0);
    m * e
}

/// Smallest d·10^k (d in 1..=10) not below `v` (> 0).
fn nice_ceil(v: f64) -> f64 {
    let e = 10f64.powf(v.log10().floor());
    let m = (v / e * (1.0 - 1e-12)).ceil().clamp(1.0, 10.0);
    m * e
}

/// Tick values for a log axis over `lo..hi`: (labelled, grid-only).
///
/// Labels go on 1-2-…-9, 1-2-5 or 1 times powers of ten, the densest set
/// that gives at most ten labels (every n-th decade for very wide ranges).
fn log_ticks(lo: f64, hi: f64) -> (Vec<f64>, Vec<f64>) {
    let first = lo.log10().floor() as i32;
    let last = hi.log10().ceil() as i32;
    let within = |v: &f64| *v >= lo * (1.0 - 1e-9) && *v <= hi * (1.0 + 1e-9);
    let set = |mantissas: &[f64]| -> Vec<f64> {
        (first..=last)
            .flat_map(|k| mantissas.iter().map(move |m| m * 10f64.powi(k)))
            .filter(within)
            .collect()
    };
    let all = set(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
    let one_two_five = set(&[1.0, 2.0, 5.0]);
    let decades = set(&[1.0]);
    if all.len() <= 10 {
        (all, Vec::new())
    } else if one_two_five.len() <= 10 {
        (one_two_five, all)
    } else if decades.len() <= 10 {
        let light = if all.len() <= 100 {
            all
        } else {
            decades.clone()
        };
        (decades, light)
    } else {
        let step = decades.len().div_ceil(10);
        let bold = decades.iter().copied().step_by(step).collect();
        (bold, decades)
    }
}

// -------------------------------------------------------------- rates ----

/// One cleaned rate line.
struct RateLine<'a> {
    /// Index of the series in the caller's slice (for its colour).
    index: usize,
    /// Legend label.
    label: &'a str,
    /// Finite points, sorted by time.
    points: Vec<(f64, f64)>,
}

/// A rates-over-time chart with its data cleaned.
struct Rates<'a> {
    /// Chart title.
    title: &'a str,
    /// Y axis description.
    y_label: &'a str,
    /// Non-empty lines.
    lines: Vec<RateLine<'a>>,
}

impl<'a> Rates<'a> {
    /// Cleans the caller's series.
    fn new(title: &'a str, y_label: &'a str, series: &'a [RateSeries]) -> Self {
        let lines = series
            .iter()
            .enumerate()
            .filter_map(|(index, s)| {
                let mut points: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .copied()
                    .filter(|(t, v)| t.is_finite() && v.is_finite())
                    .collect();
                if points.is_empty() {
                    return None;
                }
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                Some(RateLine {
                    index,
                    label: &s.label,
                    points,
                })
            })
            .collect();
        Rates {
            title,
            y_label,
            lines,
        }
    }

    /// Draws the chart.
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        if self.lines.is_empty() {
            return draw_no_data(root, self.title);
        }
        let all = || self.lines.iter().flat_map(|l| l.points.iter().copied());
        let t_min = all().map(|p| p.0).fold(f64::INFINITY, f64::min);
        let t_max = all().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
        let v_min = all().map(|p| p.1).fold(f64::INFINITY, f64::min);
        let v_max = all().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
        let x_lo = t_min.min(0.0);
        let x_hi = if t_max > x_lo { t_max } else { x_lo + 1.0 };
        // Head room above the lines for the legend.
        let y_lo = if v_min < 0.0 { v_min * 1.1 } else { 0.0 };
        let y_hi = if v_max > 0.0 { v_max * 1.3 } else { 1.0 };

        let mut chart = chart_builder(root, self.title, 75)
            .build_cartesian_2d(x_lo..x_hi, y_lo..y_hi)
            .map_err(err)?;
        draw_mesh!(chart
            .configure_mesh()
            .x_desc("time since start (s)")
            .y_desc(self.y_label)
            .x_label_formatter(&|v| fmt_tick(*v))
            .y_label_formatter(&|v| fmt_tick(*v))
            .max_light_lines(1))?;

        for l in &self.lines {
            let col = colour(l.index);
            chart
                .draw_series(LineSeries::new(
                    l.points.iter().copied(),
                    col.stroke_width(2),
                ))
                .map_err(err)?
                .label(l.label)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], col.stroke_width(3)));
            // Sparse lines get dots so single points stay visible.
            if l.points.len() <= 20 {
                chart
                    .draw_series(l.points.iter().map(|&p| Circle::new(p, 3, col.filled())))
                    .map_err(err)?;
            }
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperRight)
    }
}
