//! Pictures of a run, drawn with plotters: `--plot FILE.svg|png` of every training command draws the
//! training curves from the report's epoch rows (`training_curves`), and `classify --labels … --plot`
//! the confusion matrix (`confusion_matrix`). The extension chooses the format: SVG, or PNG (8-bit RGB,
//! encoded by `image`). Text is set in DejaVu Sans, embedded in the binary (`assets/fonts`), so no
//! system font is needed. Pictures are written atomically (`fsutil::write_atomic`), and `check` refuses a
//! bad `--plot` before any work.

use crate::harness::classification::Evaluation;
use crate::harness::report::{Display, EpochRow};
use crate::io::fsutil;
use anyhow::{Context, Result, anyhow, bail};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use plotters::style::FontTransform;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The help of every training command's `--plot`.
pub const HELP: &str = "Draw the training curves to FILE.svg or FILE.png when the run ends (also when it is \
interrupted or diverges): the train, validation and test loss per epoch (per evaluation for transformer), and the \
accuracy, MAE or perplexity where the run measures them";

/// The font family every text of a picture is set in: the embedded DejaVu Sans.
const FAMILY: &str = "sans-serif";
static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

/// Registers the embedded font with plotters, once.
fn register_font() -> Result<()> {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if !ok {
        bail!("the embedded font cannot be read");
    }
    Ok(())
}

/// A picture's file format, chosen by its extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `.svg`: SVG 1.1, text as text.
    Svg,
    /// `.png`: 8-bit RGB.
    Png,
}

impl Format {
    /// The format of the `--plot` `path`, from its extension (in any case); any other is refused.
    pub fn of(path: &Path) -> Result<Format> {
        match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("svg") => Ok(Format::Svg),
            Some("png") => Ok(Format::Png),
            _ => bail!(
                "--plot {}: give a file name ending in .svg or .png (its extension chooses the picture's format)",
                path.display()
            ),
        }
    }
}

/// Checks `--plot` before any work: an extension of .svg or .png, a directory that exists, not the model
/// file `out` (if any), and what `fsutil::check_output_named` checks (a file name, none of the run's
/// `inputs`, a directory that takes a new file, a writable file if one is there).
pub fn check(plot: Option<&Path>, out: Option<&Path>, inputs: &[(&str, &Path)]) -> Result<()> {
    let Some(path) = plot else { return Ok(()) };
    let shown = path.display();
    let flag = "--plot";
    Format::of(path)?;
    if let Some(out) = out
        && same_target(path, out)
    {
        bail!("{flag} {shown} is also --out, the model file; give the picture a name of its own");
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        let what = if dir.exists() { "is not a directory" } else { "does not exist" };
        bail!("{flag} {shown}: the directory {} {what}", dir.display());
    }
    // The check's lock is let go at once: the picture is written in one rename at the end.
    fsutil::check_data_output(flag, path, inputs).map(drop)
}

/// Whether writing `a` would write `b`: the same file, or the same name in the same directory (through
/// links, `..` or another spelling), also where neither exists yet.
fn same_target(a: &Path, b: &Path) -> bool {
    let place = |p: &Path| -> Option<(PathBuf, std::ffi::OsString)> {
        let p = fsutil::resolve_link(p);
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Some((std::fs::canonicalize(dir).ok()?, p.file_name()?.to_owned()))
    };
    fsutil::same_file(a, b) || a == b || place(a).is_some_and(|pa| Some(pa) == place(b))
}

/// Draws the training curves of `rows` under `title` to `path` (`--plot`), if asked, and says so on
/// `display`; with no rows (no epoch completed) nothing is written, and a line says so. A failure is
/// returned as its one-line error, for the run's ending to report (the run's model is not lost to it).
pub fn training_curves(path: Option<&Path>, title: &str, rows: &[EpochRow], display: &Display) -> Option<String> {
    let path = path?;
    let result = (|| -> Result<bool> {
        let curves = Curves::of(title, rows);
        if curves.panels.is_empty() {
            return Ok(false);
        }
        let bytes = render(&curves, Format::of(path)?)?;
        fsutil::write_atomic(path, &bytes)?;
        Ok(true)
    })();
    let shown = path.display();
    match result {
        Ok(true) => {
            let what = if rows.len() == 1 { "1 point" } else { &format!("{} points", rows.len()) };
            display.line(&format!("--plot {shown}: the training curves ({what})"));
            None
        }
        Ok(false) => {
            display.line(&format!("--plot {shown} not written: no epoch completed, so there is nothing to draw"));
            None
        }
        Err(e) => Some(format!("--plot {shown} not written: {e:#}")),
    }
}

/// Draws the confusion matrix of `evaluation` (rows: true classes, columns: predicted ones, each named by
/// `names`) under `title` to `path`, in the format of its extension.
pub fn confusion_matrix(path: &Path, title: &str, evaluation: &Evaluation, names: &[String]) -> Result<()> {
    let matrix = Matrix { title, evaluation, names };
    let bytes = render(&matrix, Format::of(path)?)?;
    fsutil::write_atomic(path, &bytes)
}

/// What a picture is: its size and how it is drawn, on any plotters backend.
trait Picture {
    /// Width and height in pixels.
    fn size(&self) -> Result<(u32, u32)>;
    /// Draws the picture on `root`, of `size()`.
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB>;
}

type DrawResult<DB> = std::result::Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// `picture` as the bytes of a file of `format`.
fn render(picture: &impl Picture, format: Format) -> Result<Vec<u8>> {
    register_font()?;
    let (width, height) = picture.size()?;
    let failed = |e: &dyn std::fmt::Display| anyhow!("cannot draw the picture: {e}");
    match format {
        Format::Svg => {
            let mut svg = String::new();
            {
                let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
                picture.draw(&root).map_err(|e| failed(&e))?;
                root.present().map_err(|e| failed(&e))?;
            }
            Ok(svg.into_bytes())
        }
        Format::Png => {
            let mut pixels = vec![0u8; width as usize * height as usize * 3];
            {
                let root = BitMapBackend::with_buffer(&mut pixels, (width, height)).into_drawing_area();
                picture.draw(&root).map_err(|e| failed(&e))?;
                root.present().map_err(|e| failed(&e))?;
            }
            let image = image::RgbImage::from_raw(width, height, pixels)
                .ok_or_else(|| anyhow!("cannot draw the picture: the pixel buffer has the wrong size"))?;
            let mut bytes = std::io::Cursor::new(Vec::new());
            image.write_to(&mut bytes, image::ImageFormat::Png).context("cannot encode the PNG")?;
            Ok(bytes.into_inner())
        }
    }
}

/// A text style of the embedded font at `size` pixels.
fn font(size: f64) -> TextStyle<'static> {
    (FAMILY, size).into_font().color(&BLACK)
}

/// A number on an axis: up to four significant digits, without trailing zeros; powers of ten in
/// scientific notation far from 1.
fn tick(value: f64) -> String {
    if value == 0.0 || !value.is_finite() {
        return format!("{value}");
    }
    let magnitude = value.abs().log10().floor();
    if !(-3.0..5.0).contains(&magnitude) {
        let text = format!("{value:.1e}");
        return text.replace(".0e", "e");
    }
    let decimals = (3.0 - magnitude).max(0.0) as usize;
    let text = format!("{value:.decimals$}");
    if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.').to_string() } else { text }
}

// ---------------------------------------------------------------------------------------------------
// Training curves

/// Where a series' figures were measured, which gives its colour: training, validation or test data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Set {
    Train,
    Val,
    Test,
}

impl Set {
    /// The colours of this set's series, the first for its first series in a panel (so a set keeps its
    /// colour from panel to panel), the second for another (validation top-5 beside top-1 accuracy).
    fn colors(self) -> [RGBColor; 2] {
        match self {
            Set::Train => [RGBColor(31, 119, 180), RGBColor(23, 190, 207)],
            Set::Val => [RGBColor(255, 127, 14), RGBColor(148, 103, 189)],
            Set::Test => [RGBColor(44, 160, 44), RGBColor(140, 86, 75)],
        }
    }
}

/// What a panel shows, in the order panels are stacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Figure {
    Loss,
    Accuracy,
    Mae,
    Perplexity,
}

impl Figure {
    /// The figure a row's key measures (`val_loss`, `test_accuracy`, `val_top5_accuracy`, `val_mae`,
    /// `val_perplexity`) and on which set; none for the rest (`epoch`, speeds, times, `step`, and
    /// `last_step_loss`, one step's loss beside the interval's mean).
    fn of_key(key: &str) -> Option<(Figure, Set)> {
        let set = match key.split('_').next()? {
            "train" => Set::Train,
            "val" => Set::Val,
            "test" => Set::Test,
            _ => return None,
        };
        let figure = match key.rsplit('_').next()? {
            "loss" => Figure::Loss,
            "accuracy" => Figure::Accuracy,
            "mae" => Figure::Mae,
            "perplexity" => Figure::Perplexity,
            _ => return None,
        };
        Some((figure, set))
    }

    /// The y axis's name.
    fn axis(self) -> &'static str {
        match self {
            Figure::Loss => "loss",
            Figure::Accuracy => "accuracy (%)",
            Figure::Mae => "MAE",
            Figure::Perplexity => "perplexity",
        }
    }
}

/// A series' name from its key: `val_top5_accuracy` → "val top-5 accuracy", `test_mae` → "test MAE".
fn series_name(key: &str) -> String {
    key.split('_')
        .map(|word| match word {
            "mae" => "MAE".to_string(),
            "mse" => "MSE".to_string(),
            w => match w.strip_prefix("top") {
                Some(k) if !k.is_empty() && k.chars().all(|c| c.is_ascii_digit()) => format!("top-{k}"),
                _ => w.to_string(),
            },
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// One curve: its name, colour and points (x, value), the non-finite values left out.
#[derive(Clone, Debug, PartialEq)]
struct Series {
    name: String,
    color: RGBColor,
    points: Vec<(f64, f64)>,
}

/// One panel: a figure's curves over the same x axis.
#[derive(Clone, Debug, PartialEq)]
struct Panel {
    figure: Figure,
    series: Vec<Series>,
}

impl Panel {
    /// The range of its values, none when it has no finite one.
    fn range(&self) -> Option<(f64, f64)> {
        let values = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
        values.fold(None, |r, v| Some(r.map_or((v, v), |(lo, hi): (f64, f64)| (lo.min(v), hi.max(v)))))
    }

    /// Whether its y axis is logarithmic: for positive values over more than a decade (a loss that falls
    /// from 0.7 to 0.001 is a line along the floor on a linear axis); accuracies stay linear.
    fn log_scale(&self) -> bool {
        self.figure != Figure::Accuracy && self.range().is_some_and(|(lo, hi)| lo > 0.0 && hi / lo > 10.0)
    }
}

/// The training curves of a run: one panel per figure its rows carry, over the epoch (or, where the
/// rows have `step`, the optimizer step).
#[derive(Clone, Debug, PartialEq)]
struct Curves {
    title: String,
    x_name: &'static str,
    panels: Vec<Panel>,
}

impl Curves {
    /// The curves of `rows`: a series per figure in them (losses, accuracies in %, MAE, perplexity),
    /// coloured by the data it was measured on; none for a figure with no finite value.
    fn of(title: &str, rows: &[EpochRow]) -> Curves {
        let steps: Option<Vec<f64>> = rows.iter().map(|r| r.extra.get("step").and_then(Value::as_f64)).collect();
        let (x_name, xs) = match steps {
            Some(steps) if !rows.is_empty() => ("step", steps),
            _ => ("epoch", rows.iter().map(|r| r.epoch as f64).collect()),
        };
        // Every key's values, in the order of the first row that has the key.
        let mut keys: Vec<(String, Figure, Set)> = Vec::new();
        let mut values: Vec<Vec<(f64, f64)>> = Vec::new();
        for (row, &x) in rows.iter().zip(&xs) {
            let Ok(Value::Object(map)) = serde_json::to_value(row) else { continue };
            for (key, value) in map {
                let Some((figure, set)) = Figure::of_key(&key) else { continue };
                let Some(v) = value.as_f64().filter(|v| v.is_finite()) else { continue };
                let v = if figure == Figure::Accuracy { 100.0 * v } else { v };
                let at = match keys.iter().position(|(k, ..)| *k == key) {
                    Some(at) => at,
                    None => {
                        keys.push((key, figure, set));
                        values.push(Vec::new());
                        keys.len() - 1
                    }
                };
                values[at].push((x, v));
            }
        }
        let mut order: Vec<usize> = (0..keys.len()).collect();
        // Panels in figure order; in a panel, train before val before test, then the row's order.
        order.sort_by_key(|&i| (keys[i].1, keys[i].2, i));
        let mut panels: Vec<Panel> = Vec::new();
        for i in order {
            let (key, figure, set) = &keys[i];
            if panels.last().is_none_or(|p| p.figure != *figure) {
                panels.push(Panel { figure: *figure, series: Vec::new() });
            }
            let panel = panels.last_mut().expect("a panel was pushed");
            let nth = panel.series.iter().filter(|s| set.colors().contains(&s.color)).count();
            let color = set.colors()[nth.min(1)];
            panel.series.push(Series { name: series_name(key), color, points: std::mem::take(&mut values[i]) });
        }
        Curves { title: title.to_string(), x_name, panels }
    }

    /// The x axis's range: the points' and a little more on each side, so that the first and last
    /// points stand clear of the axes (half an epoch on each side of a single point).
    fn x_range(&self) -> std::ops::Range<f64> {
        let xs = self.panels.iter().flat_map(|p| &p.series).flat_map(|s| s.points.iter().map(|p| p.0));
        let (lo, hi) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)));
        let pad = if hi > lo { (hi - lo) * 0.025 } else { 0.5 };
        lo - pad..hi + pad
    }
}

/// The x axis: epochs or steps, linear, its ticks at whole numbers (`x_ticks`).
#[derive(Clone, Debug)]
struct XAxis {
    range: std::ops::Range<f64>,
    ticks: Vec<f64>,
}

impl XAxis {
    fn new(range: std::ops::Range<f64>) -> XAxis {
        XAxis { ticks: x_ticks(&range), range }
    }
}

impl Ranged for XAxis {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let share = (value - self.range.start) / (self.range.end - self.range.start);
        limit.0 + (share * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<Hint: plotters::coord::ranged1d::KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() { Vec::new() } else { self.ticks.clone() }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.range.clone()
    }
}

/// A logarithmic y axis whose ticks read at any span: 1, 2 and 5 × 10^k over a decade or two, the
/// powers of ten over more (every other one, or fewer, where there are many).
#[derive(Clone, Debug)]
struct LogAxis {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl LogAxis {
    fn new(lo: f64, hi: f64) -> LogAxis {
        LogAxis { ticks: log_ticks(lo, hi), lo, hi }
    }
}

impl Ranged for LogAxis {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let share = (value.max(f64::MIN_POSITIVE).log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10());
        limit.0 + (share * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<Hint: plotters::coord::ranged1d::KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() { Vec::new() } else { self.ticks.clone() }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

/// The ticks of a log axis from `lo` to `hi` (both positive), see `LogAxis`.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let decades = (hi / lo).log10();
    let (multiples, every): (&[f64], i32) = match decades {
        d if d < 1.2 => (&[1.0, 1.5, 2.0, 3.0, 5.0, 7.0], 1),
        d if d < 2.5 => (&[1.0, 2.0, 5.0], 1),
        d if d < 7.0 => (&[1.0], 1),
        d => (&[1.0], (d / 7.0).ceil() as i32),
    };
    let (first, last) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    (first..=last)
        .filter(|k| k.rem_euclid(every) == 0)
        // Divided rather than multiplied below 1, so that 0.3 is the 0.3 a person writes.
        .flat_map(|k| multiples.iter().map(move |m| if k >= 0 { m * 10f64.powi(k) } else { m / 10f64.powi(-k) }))
        .filter(|v| (lo..=hi).contains(v))
        .collect()
}

/// The x axis's ticks: whole numbers (epochs, steps) 1, 2 or 5 × 10^k apart, about eight of them.
fn x_ticks(range: &std::ops::Range<f64>) -> Vec<f64> {
    let span = (range.end - range.start).max(1.0);
    let raw = span / 8.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * magnitude).find(|&s| s >= raw).unwrap_or(raw).max(1.0).round();
    let first = (range.start / step).ceil() as i64;
    let last = (range.end / step).floor() as i64;
    (first..=last).map(|k| k as f64 * step).collect()
}

/// Width of a curves picture and height of each of its panels, in pixels.
const CURVES_WIDTH: u32 = 960;
const PANEL_HEIGHT: u32 = 380;
const TITLE_HEIGHT: u32 = 44;

impl Picture for Curves {
    fn size(&self) -> Result<(u32, u32)> {
        Ok((CURVES_WIDTH, TITLE_HEIGHT + PANEL_HEIGHT * self.panels.len().max(1) as u32))
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        root.fill(&WHITE)?;
        let (top, body) = root.split_vertically(TITLE_HEIGHT);
        draw_title(&top, &self.title)?;
        let areas = body.split_evenly((self.panels.len().max(1), 1));
        let x_range = self.x_range();
        for (panel, area) in self.panels.iter().zip(&areas) {
            let Some((lo, hi)) = panel.range() else { continue };
            if panel.log_scale() {
                let y = LogAxis::new(lo / 1.25, hi * 1.25);
                draw_panel(area, panel, self.x_name, x_range.clone(), y)?;
            } else {
                let pad = if hi > lo { (hi - lo) * 0.06 } else { lo.abs().max(1.0) * 0.05 };
                let (mut lo, mut hi) = (lo - pad, hi + pad);
                if panel.figure == Figure::Accuracy {
                    (lo, hi) = (lo.max(0.0), hi.min(100.0));
                } else if lo < 0.0 && panel.range().is_some_and(|(l, _)| l >= 0.0) {
                    lo = 0.0;
                }
                draw_panel(area, panel, self.x_name, x_range.clone(), lo..hi)?;
            }
        }
        Ok(())
    }
}

/// `title` centred in `area`, in the largest size up to 22 px that fits its width (cut with "…" below 13).
fn draw_title<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, title: &str) -> DrawResult<DB> {
    let (width, height) = area.dim_in_pixel();
    let room = width.saturating_sub(24);
    let mut size = 22.0;
    while size > 13.0 && area.estimate_text_size(title, &font(size))?.0 > room {
        size -= 1.0;
    }
    let mut text: Vec<char> = title.chars().collect();
    let mut shown = title.to_string();
    while area.estimate_text_size(&shown, &font(size))?.0 > room && text.len() > 1 {
        text.pop();
        shown = format!("{}…", text.iter().collect::<String>().trim_end());
    }
    let style = font(size).pos(plotters::style::text_anchor::Pos::new(
        plotters::style::text_anchor::HPos::Center,
        plotters::style::text_anchor::VPos::Center,
    ));
    area.draw(&Text::new(shown, (width as i32 / 2, height as i32 / 2 + 4), style))
}

/// One panel of curves on `area`, its y axis `y` (linear or logarithmic).
fn draw_panel<DB, Y>(
    area: &DrawingArea<DB, Shift>,
    panel: &Panel,
    x_name: &str,
    x: std::ops::Range<f64>,
    y: Y,
) -> DrawResult<DB>
where
    DB: DrawingBackend,
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let (legend, area) = area.split_vertically(LEGEND_HEIGHT);
    draw_legend(&legend, &panel.series, LEFT_MARGIN + Y_LABEL_AREA)?;
    let mut chart = ChartBuilder::on(&area)
        .margin_left(LEFT_MARGIN)
        .margin_right(28)
        .margin_top(6)
        .margin_bottom(6)
        .x_label_area_size(48)
        .y_label_area_size(Y_LABEL_AREA)
        .build_cartesian_2d(XAxis::new(x), y)?;
    chart
        .configure_mesh()
        .x_desc(x_name)
        .y_desc(panel.figure.axis())
        .y_labels(8)
        .max_light_lines(1)
        .x_label_formatter(&|x| tick(*x))
        .y_label_formatter(&|v| tick(*v))
        .label_style(font(15.0))
        .axis_desc_style(font(16.0))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(205, 205, 205))
        .draw()?;
    for series in &panel.series {
        let color = series.color;
        let line = ShapeStyle::from(&color).stroke_width(2);
        chart.draw_series(LineSeries::new(series.points.iter().copied(), line))?;
        // Each point marked where there are few enough to tell apart, larger where there are very few
        // (one point is no line).
        let radius = match series.points.len() {
            0..=3 => 5,
            4..=40 => 3,
            _ => 0,
        };
        if radius > 0 {
            chart.draw_series(series.points.iter().map(|&p| Circle::new(p, radius, color.filled())))?;
        }
    }
    Ok(())
}

/// The height of the legend above each panel, and the panel's left margin and the width of its y
/// labels (the legend starts where the plot does).
const LEGEND_HEIGHT: u32 = 30;
const LEFT_MARGIN: u32 = 12;
const Y_LABEL_AREA: u32 = 78;

/// The legend of a panel's `series` in one line across `area` from `left`, above the plot, where it can
/// never hide a curve: a short line of each series' colour, then its name.
fn draw_legend<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, series: &[Series], left: u32) -> DrawResult<DB> {
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    let style = font(15.0).pos(Pos::new(HPos::Left, VPos::Center));
    let y = area.dim_in_pixel().1 as i32 / 2 + 2;
    let mut x = left as i32;
    for s in series {
        // The font's centre sits a little above the middle of its box: the line is raised to meet it.
        area.draw(&PathElement::new(vec![(x, y - 3), (x + 24, y - 3)], s.color.stroke_width(3)))?;
        area.draw(&Text::new(s.name.clone(), (x + 30, y), style.clone()))?;
        x += 30 + area.estimate_text_size(&s.name, &style)?.0 as i32 + 28;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Confusion matrix

/// A confusion matrix to draw.
struct Matrix<'a> {
    title: &'a str,
    evaluation: &'a Evaluation,
    names: &'a [String],
}

/// The matrix's layout, in pixels.
struct MatrixLayout {
    /// The side of a cell.
    cell: u32,
    /// Left of the grid: the axis name and the row labels.
    left: u32,
    /// Above the grid: the title, the axis name and the column labels.
    top: u32,
    /// Right of the grid: the recall column.
    right: u32,
    /// Below the grid.
    bottom: u32,
    /// The size of the class names' text.
    label_size: f64,
}

/// The class `k`'s label: its number and, where the name is not the number, its name.
fn class_label(names: &[String], k: usize) -> String {
    match names.get(k) {
        Some(name) if *name != k.to_string() => format!("{k} {name}"),
        _ => k.to_string(),
    }
}

impl Matrix<'_> {
    fn classes(&self) -> usize {
        self.evaluation.classes
    }

    /// The layout: cells of 60 px for ten classes or fewer, smaller for more (the grid about 640 px wide,
    /// at least 4 px a cell), and room for the widest class label at 15 px.
    fn layout(&self) -> Result<MatrixLayout> {
        let n = self.classes().max(1) as u32;
        let cell = (640 / n).clamp(4, 60);
        let label_size = f64::from(cell).clamp(8.0, 15.0);
        let widest = (0..self.classes())
            .map(|k| text_width(&class_label(self.names, k), label_size))
            .max()
            .unwrap_or(0)
            .min(260);
        let labels = if cell >= 8 { widest } else { 0 };
        Ok(MatrixLayout { cell, left: 44 + labels, top: 86 + labels, right: 90, bottom: 24, label_size })
    }
}

/// The width in pixels of `text` at `size`, as the embedded font sets it.
fn text_width(text: &str, size: f64) -> u32 {
    // The same measure plotters takes when it lays text out.
    match plotters::style::FontDesc::new(FontFamily::Name(FAMILY), size, FontStyle::Normal).box_size(text) {
        Ok((w, _)) => w,
        Err(_) => (text.chars().count() as f64 * size * 0.6) as u32,
    }
}

impl Picture for Matrix<'_> {
    fn size(&self) -> Result<(u32, u32)> {
        register_font()?;
        let l = self.layout()?;
        let grid = l.cell * self.classes() as u32;
        let width = (l.left + grid + l.right).max(520);
        Ok((width, l.top + grid + l.bottom))
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        use plotters::style::text_anchor::{HPos, Pos, VPos};
        root.fill(&WHITE)?;
        let Ok(l) = self.layout() else { return Ok(()) };
        let n = self.classes();
        let cell = l.cell as i32;
        let (x0, y0) = (l.left as i32, l.top as i32);
        let grid = cell * n as i32;
        let (title_area, _) = root.split_vertically(40);
        draw_title(&title_area, self.title)?;

        let small = font(l.label_size);
        let centre = Pos::new(HPos::Center, VPos::Center);
        // Axis names: predicted above the columns, true left of the rows (read from below).
        root.draw(&Text::new("predicted class", (x0 + grid / 2, 56), font(16.0).pos(centre)))?;
        let vertical = font(16.0).transform(FontTransform::Rotate270).pos(centre);
        root.draw(&Text::new("true class", (16, y0 + grid / 2), vertical))?;

        let rows = self.evaluation.confusion_rows();
        for (t, row) in rows.iter().enumerate() {
            let total: u64 = row.iter().sum();
            for (p, &count) in row.iter().enumerate() {
                // Shaded by the share of the true class's images that went to this column.
                let share = count as f64 / total.max(1) as f64;
                let (base, strong) =
                    if t == p { ((255, 255, 255), (8, 81, 156)) } else { ((255, 255, 255), (203, 24, 29)) };
                let mix = |a: u8, b: u8| (f64::from(a) + (f64::from(b) - f64::from(a)) * share.sqrt()).round() as u8;
                let fill = RGBColor(mix(base.0, strong.0), mix(base.1, strong.1), mix(base.2, strong.2));
                let (cx, cy) = (x0 + p as i32 * cell, y0 + t as i32 * cell);
                root.draw(&Rectangle::new([(cx, cy), (cx + cell, cy + cell)], fill.filled()))?;
                if l.cell >= 26 {
                    let size = (f64::from(l.cell) * 0.3).min(16.0);
                    let ink = if share.sqrt() > 0.55 { WHITE } else { BLACK };
                    let style = font(size).color(&ink).pos(centre);
                    root.draw(&Text::new(count.to_string(), (cx + cell / 2, cy + cell / 2), style))?;
                }
            }
            if l.cell >= 8 {
                let recall = 100.0 * row.get(t).copied().unwrap_or(0) as f64 / total.max(1) as f64;
                let style = small.clone().pos(Pos::new(HPos::Left, VPos::Center));
                let at = (x0 + grid + 10, y0 + t as i32 * cell + cell / 2);
                root.draw(&Text::new(format!("{recall:.1}%"), at, style))?;
            }
        }
        // The grid's lines and frame.
        let line = RGBColor(190, 190, 190);
        for k in 0..=n as i32 {
            root.draw(&PathElement::new(vec![(x0, y0 + k * cell), (x0 + grid, y0 + k * cell)], line))?;
            root.draw(&PathElement::new(vec![(x0 + k * cell, y0), (x0 + k * cell, y0 + grid)], line))?;
        }
        if l.cell >= 8 {
            root.draw(&Text::new(
                "recall",
                (x0 + grid + 10, y0 - 12),
                small.clone().pos(Pos::new(HPos::Left, VPos::Center)),
            ))?;
            for k in 0..n {
                let label = class_label(self.names, k);
                let mid = k as i32 * cell + cell / 2;
                let row_style = small.clone().pos(Pos::new(HPos::Right, VPos::Center));
                root.draw(&Text::new(label.clone(), (x0 - 8, y0 + mid), row_style))?;
                // Column labels read upwards, ending just above the grid.
                let column_style =
                    small.clone().transform(FontTransform::Rotate270).pos(Pos::new(HPos::Left, VPos::Center));
                root.draw(&Text::new(label, (x0 + mid, y0 - 8), column_style))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(epoch: usize, train: f64, val: Option<f64>, accuracy: Option<f64>) -> EpochRow {
        EpochRow {
            epoch,
            train_loss: train,
            val_loss: val,
            val_accuracy: accuracy,
            test_loss: None,
            test_accuracy: None,
            samples_per_s: 1000.0,
            lr: None,
            elapsed_s: epoch as f64,
            extra: Default::default(),
        }
    }

    fn names(curves: &Curves) -> Vec<Vec<String>> {
        curves.panels.iter().map(|p| p.series.iter().map(|s| s.name.clone()).collect()).collect()
    }

    #[test]
    fn each_figure_of_the_rows_gets_a_panel_and_each_set_a_series() {
        let rows: Vec<EpochRow> = (1..=3)
            .map(|e| {
                row(e, 1.0 / e as f64, Some(1.2 / e as f64), Some(0.5 + 0.1 * e as f64))
                    .with("val_perplexity", 3.0 / e as f64)
                    .with("val_top5_accuracy", 0.9)
            })
            .collect();
        let curves = Curves::of("train", &rows);
        assert_eq!(curves.x_name, "epoch");
        assert_eq!(
            names(&curves),
            [vec!["train loss", "val loss"], vec!["val accuracy", "val top-5 accuracy"], vec!["val perplexity"]]
        );
        let accuracy = &curves.panels[1].series[0];
        assert_eq!(accuracy.points, [(1.0, 60.0), (2.0, 70.0), (3.0, 80.0)]);
        // A set keeps its colour from panel to panel; a second series of it gets the other.
        assert_eq!(curves.panels[0].series[1].color, Set::Val.colors()[0]);
        assert_eq!(accuracy.color, Set::Val.colors()[0]);
        assert_eq!(curves.panels[1].series[1].color, Set::Val.colors()[1]);
        assert_eq!(curves.x_range(), 0.95..3.05, "the points stand clear of the axes");
        assert_eq!(x_ticks(&curves.x_range()), [1.0, 2.0, 3.0]);
    }

    #[test]
    fn without_validation_the_training_loss_alone_is_drawn() {
        let rows = vec![row(1, 0.7, None, None), row(501, 0.01, None, None), row(1001, 0.0005, None, None)];
        let curves = Curves::of("xor", &rows);
        assert_eq!(names(&curves), [vec!["train loss"]]);
        assert!(curves.panels[0].log_scale(), "a loss over three decades is drawn on a log axis");
        assert_eq!(log_ticks(0.0005 / 1.25, 0.7 * 1.25), [0.001, 0.01, 0.1]);
        assert_eq!(curves.x_range(), -24.0..1026.0);
        assert_eq!(x_ticks(&curves.x_range()), [0.0, 200.0, 400.0, 600.0, 800.0, 1000.0]);
        for format in [Format::Svg, Format::Png] {
            assert!(!render(&curves, format).unwrap().is_empty());
        }
    }

    #[test]
    fn one_epoch_is_a_point_in_a_range_around_it() {
        let curves = Curves::of("one", &[row(1, 2.0, Some(2.5), None)]);
        assert_eq!(curves.x_range(), 0.5..1.5);
        assert_eq!(x_ticks(&curves.x_range()), [1.0]);
        assert!(!curves.panels[0].log_scale());
        let png = render(&curves, Format::Png).unwrap();
        let decoder = png::Decoder::new(std::io::Cursor::new(png));
        let info = decoder.read_info().unwrap().info().clone();
        assert_eq!((info.width, info.height), (CURVES_WIDTH, TITLE_HEIGHT + PANEL_HEIGHT));
        let svg = String::from_utf8(render(&curves, Format::Svg).unwrap()).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("train loss") && svg.contains("val loss"), "{svg}");
    }

    #[test]
    fn steps_are_the_x_axis_where_the_rows_count_them_and_mae_has_its_panel() {
        let rows: Vec<EpochRow> =
            (1..=2).map(|e| row(e, 1.0, Some(1.1), None).with("step", 100 * e).with("last_step_loss", 0.9)).collect();
        let curves = Curves::of("transformer", &rows);
        assert_eq!((curves.x_name, curves.x_range()), ("step", 97.5..202.5));
        assert_eq!(names(&curves), [vec!["train loss", "val loss"]], "last_step_loss is no curve");

        let rows: Vec<EpochRow> =
            (1..=2).map(|e| row(e, 0.5, None, None).with("test_mae", 6.5).with("val_mae", 7.0)).collect();
        assert_eq!(names(&Curves::of("sales", &rows)), [vec!["train loss"], vec!["val MAE", "test MAE"]]);
    }

    #[test]
    fn no_rows_or_no_finite_value_draw_no_panel() {
        assert!(Curves::of("none", &[]).panels.is_empty());
        let curves = Curves::of("nan", &[row(1, f64::NAN, Some(f64::INFINITY), None)]);
        assert!(curves.panels.is_empty(), "{curves:?}");
    }

    #[test]
    fn a_log_axis_has_ticks_at_any_span() {
        assert_eq!(log_ticks(0.009, 0.25), [0.01, 0.02, 0.05, 0.1, 0.2]);
        assert_eq!(log_ticks(0.3, 2.0), [0.3, 0.5, 0.7, 1.0, 1.5, 2.0]);
        assert_eq!(log_ticks(1e-13, 2.0), [1e-12, 1e-10, 1e-8, 1e-6, 1e-4, 1e-2, 1.0]);
    }

    #[test]
    fn ticks_are_short() {
        assert_eq!(tick(0.5), "0.5");
        assert_eq!(tick(2.0), "2");
        assert_eq!(tick(1234.5678), "1235");
        assert_eq!(tick(0.012345), "0.01235");
        assert_eq!(tick(0.0001), "1e-4");
        assert_eq!(tick(250000.0), "2.5e5");
    }

    #[test]
    fn the_format_is_the_extension() {
        assert_eq!(Format::of(Path::new("a/b.SVG")).unwrap(), Format::Svg);
        assert_eq!(Format::of(Path::new("b.png")).unwrap(), Format::Png);
        for bad in ["b.jpg", "b", "b.png.txt"] {
            let e = Format::of(Path::new(bad)).unwrap_err().to_string();
            assert!(e.contains(".svg or .png"), "{e}");
        }
    }

    #[test]
    fn a_confusion_matrix_names_its_classes() {
        let mut evaluation = Evaluation::new(3);
        for (t, p) in [(0, 0), (0, 0), (1, 1), (1, 2), (2, 2), (2, 0)] {
            evaluation.record(t, p);
        }
        let names: Vec<String> = ["cat", "dog", "bird"].map(String::from).to_vec();
        let matrix = Matrix { title: "confusion", evaluation: &evaluation, names: &names };
        let svg = String::from_utf8(render(&matrix, Format::Svg).unwrap()).unwrap();
        for text in ["0 cat", "1 dog", "2 bird", "predicted class", "true class", "50.0%"] {
            assert!(svg.contains(text), "{text} missing");
        }
        assert!(render(&matrix, Format::Png).unwrap().starts_with(b"\x89PNG\r\n\x1a\n"));

        // Read back where each text is: the counts as a matrix by their rows (y) and columns (x) are the
        // confusion matrix, true classes down, predicted across, each row level with its class's name.
        let texts: Vec<(i64, i64, String)> = svg
            .split("<text ")
            .skip(1)
            .filter(|t| !t.contains("rotate"))
            .map(|t| {
                let attr = |name: &str| t.split(&format!("{name}=\"")).nth(1).unwrap().split('"').next().unwrap();
                let body = t.split('>').nth(1).unwrap().split('<').next().unwrap().trim().to_string();
                (attr("x").parse().unwrap(), attr("y").parse().unwrap(), body)
            })
            .collect();
        let counts: Vec<&(i64, i64, String)> = texts.iter().filter(|t| t.2.parse::<u64>().is_ok()).collect();
        let level = |values: Vec<i64>| {
            let mut v = values;
            v.sort();
            v.dedup();
            v
        };
        let (ys, xs) = (level(counts.iter().map(|t| t.1).collect()), level(counts.iter().map(|t| t.0).collect()));
        let mut drawn = vec![vec![0u64; xs.len()]; ys.len()];
        for (x, y, count) in &counts {
            let (row, column) = (ys.binary_search(y).unwrap(), xs.binary_search(x).unwrap());
            drawn[row][column] = count.parse().unwrap();
        }
        assert_eq!(drawn, evaluation.confusion_rows());
        for (k, name) in ["0 cat", "1 dog", "2 bird"].iter().enumerate() {
            let label = texts.iter().find(|t| t.2 == *name).unwrap();
            assert_eq!(label.1, ys[k], "{name} is not level with its row");
            assert!(label.0 < xs[0], "{name} is not left of the grid");
        }
    }
}
