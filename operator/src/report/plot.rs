//! The report's plot: per tenant, GPUs allocated (solid) and GPUs busy (dashed, where known) over
//! the window, as SVG or PNG by the file's extension.
//!
//! Text is drawn with a TrueType font read at run time (DejaVu Sans or Liberation Sans where the
//! distribution puts them, or `--font`), so nothing links a system font library.

use super::Timeline;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

const WIDTH: u32 = 1200;
const HEIGHT: u32 = 700;

/// Where distributions put a sans-serif TrueType font.
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
];

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("--plot {0}: the file must end in .svg or .png")]
    Format(PathBuf),
    #[error(
        "--plot needs a TrueType font for its text and found none of {}; install DejaVu or Liberation fonts or name one with --font",
        FONTS.join(", ")
    )]
    NoFont,
    #[error("--font {path}: {message}")]
    Font { path: PathBuf, message: String },
    #[error("--plot {path}: drawing failed: {message}")]
    Draw { path: PathBuf, message: String },
}

/// Makes `font` (or the first font of [`FONTS`] found) the font of every text drawn.
fn register(font: Option<&Path>) -> Result<(), PlotError> {
    let path = match font {
        Some(p) => p.to_path_buf(),
        None => FONTS
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .ok_or(PlotError::NoFont)?,
    };
    let bytes = std::fs::read(&path).map_err(|e| PlotError::Font {
        path: path.clone(),
        message: e.to_string(),
    })?;
    // plotters keeps the font for the process's lifetime: one CLI run draws one plot.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).map_err(|_| PlotError::Font {
        path,
        message: "not a TrueType font plotters can read".into(),
    })
}

/// Draws `timeline` into `path` (`.svg` or `.png`). `title` heads the plot.
pub fn draw(path: &Path, font: Option<&Path>, title: &str, timeline: &Timeline) -> Result<(), PlotError> {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("svg") => {
            register(font)?;
            let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
            chart(&root, title, timeline).map_err(|e| draw_failed(path, e))?;
            root.present().map_err(|e| draw_failed(path, e))
        }
        Some("png") => {
            register(font)?;
            let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
            chart(&root, title, timeline).map_err(|e| draw_failed(path, e))?;
            root.present().map_err(|e| draw_failed(path, e))
        }
        _ => Err(PlotError::Format(path.to_path_buf())),
    }
}

fn draw_failed<E: std::error::Error + Send + Sync>(path: &Path, e: DrawingAreaErrorKind<E>) -> PlotError {
    PlotError::Draw {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// A unix time as the axis shows it (UTC): with seconds over a short window, the date over a
/// long one.
fn clock(t: f64, window: f64) -> String {
    let format = match window {
        w if w <= 3600.0 => "%H:%M:%S",
        w if w <= 2.0 * 86400.0 => "%H:%M",
        _ => "%m-%d %H:%M",
    };
    jiff::Timestamp::from_second(t as i64)
        .map(|ts| ts.strftime(format).to_string())
        .unwrap_or_default()
}

fn chart<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    t: &Timeline,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let points = t.allocated.values().chain(t.used.values()).flatten();
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0.0f64);
    for &(x, y) in points.filter(|(_, y)| y.is_finite()) {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        // Nothing to draw: an empty frame that says so, rather than no file.
        (x0, x1) = (0.0, 1.0);
    }
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 26))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1.max(x0 + 1.0), 0.0..(y1 * 1.1).max(1.0))?;
    chart
        .configure_mesh()
        .x_desc("time (UTC)")
        .y_desc("GPUs")
        .x_labels(8)
        .x_label_formatter(&|x| clock(*x, x1 - x0))
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .draw()?;
    for (i, (tenant, series)) in t.allocated.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let line: Vec<(f64, f64)> = series.iter().copied().filter(|(_, y)| y.is_finite()).collect();
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(3)))?
            .label(match tenant.as_str() {
                crate::accounting::UNALLOCATED => tenant.clone(),
                _ => format!("{tenant} allocated"),
            })
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3)));
        if let Some(used) = t.used.get(tenant) {
            let line: Vec<(f64, f64)> = used.iter().copied().filter(|(_, y)| y.is_finite()).collect();
            chart
                .draw_series(DashedLineSeries::new(line, 8, 5, color.stroke_width(2)))?
                .label(format!("{tenant} busy"))
                .legend(move |(x, y)| {
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(0, 0), (9, 0)], color.stroke_width(2))
                        + PathElement::new(vec![(15, 0), (24, 0)], color.stroke_width(2))
                });
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()?;
    Ok(())
}
