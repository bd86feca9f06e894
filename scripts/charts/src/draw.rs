//! Drawing a chart: a title and a line of context above, the plot (log axes where values
//! span orders of magnitude, plotted as log10 on a linear axis with ticks placed here), and a
//! legend below it, where it never covers a point.

use std::path::Path;

use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::prelude::*;

use crate::Error;

const WIDTH: u32 = 800;
const HEIGHT: u32 = 480;
const FONT: &str = "sans-serif";

/// Colours by series index: reliable-queue (index 0) is always the blue one.
const PALETTE: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];
const GREY: RGBColor = RGBColor(0x55, 0x55, 0x55);

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Line {
    Solid,
    Dashed,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Marker {
    Circle,
    Triangle,
    Square,
}

/// How an axis writes its values.
#[derive(Debug, Clone, Copy)]
pub enum Format {
    /// 1.5M, 20k, 500.
    Count,
    /// Whole numbers below 10,000 written out (1024), larger ones as counts (200k, 1M).
    Exact,
    /// Microseconds as µs, ms or s.
    Micros,
    /// Bytes, as a plain number (the axis label says bytes).
    Bytes,
    /// A plain number.
    Plain,
}

#[derive(Debug)]
pub struct Series {
    /// The legend's name (one entry per name).
    pub name: String,
    /// Index into the palette.
    pub color: usize,
    pub line: Line,
    pub marker: Marker,
    /// In data units, ordered by x.
    pub points: Vec<(f64, f64)>,
    /// Plotted against the right-hand axis.
    pub secondary: bool,
}

#[derive(Debug)]
pub struct Axis {
    label: String,
    format: Format,
    log: bool,
    /// The range and ticks in plot units (log10 of the value on a log axis).
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
    light: Vec<f64>,
    /// Names for the positions 0, 1, ... (a categorical axis).
    categories: Option<Vec<String>>,
}

impl Axis {
    /// Client, thread or size counts: a log axis with a tick at each value measured.
    pub fn clients(label: &str, values: &[f64]) -> Axis {
        let mut ticks: Vec<f64> = values
            .iter()
            .copied()
            .filter(|v| v.is_finite() && *v > 0.0)
            .collect();
        ticks.sort_by(f64::total_cmp);
        ticks.dedup();
        let (lo, hi) = match (ticks.first(), ticks.last()) {
            (Some(&lo), Some(&hi)) if hi > lo => (lo / 1.5, hi * 1.5),
            (Some(&v), _) => (v / 3.0, v * 3.0),
            _ => (1.0, 10.0),
        };
        Axis {
            label: label.to_owned(),
            format: Format::Exact,
            log: true,
            lo: lo.log10(),
            hi: hi.log10(),
            ticks: ticks.iter().map(|v| v.log10()).collect(),
            light: Vec::new(),
            categories: None,
        }
    }

    /// A log axis when the values span more than 20x (and are all positive), else a linear
    /// one from 0.
    pub fn fit(label: &str, format: Format, values: impl Iterator<Item = f64>) -> Axis {
        let values: Vec<f64> = values.filter(|v| v.is_finite()).collect();
        let positive: Vec<f64> = values.iter().copied().filter(|v| *v > 0.0).collect();
        let min = positive.iter().copied().fold(f64::INFINITY, f64::min);
        let max = positive.iter().copied().fold(0.0, f64::max);
        if positive.len() == values.len() && !positive.is_empty() && max / min > 20.0 {
            Axis::log(label, format, min, max)
        } else {
            Axis::linear_from_zero(label, format, &values)
        }
    }

    fn log(label: &str, format: Format, min: f64, max: f64) -> Axis {
        let lo = (min / 1.3).log10().floor();
        let hi = (max * 1.3).log10().ceil();
        let decades = (hi - lo).round() as i32;
        let mut ticks = Vec::new();
        let mut light = Vec::new();
        for d in lo as i32..=hi as i32 {
            let base = 10f64.powi(d);
            ticks.push(base.log10());
            for m in 2..=9 {
                let v = (base * m as f64).log10();
                if v > hi {
                    break;
                }
                light.push(v);
                if decades <= 2 && (m == 2 || m == 5) {
                    ticks.push(v);
                }
            }
        }
        Axis {
            label: label.to_owned(),
            format,
            log: true,
            lo,
            hi,
            ticks,
            light,
            categories: None,
        }
    }

    /// A linear axis from 0 to a round number above the largest value, with room above it.
    pub fn linear_from_zero(label: &str, format: Format, values: &[f64]) -> Axis {
        Axis::linear(label, format, values, 1.08)
    }

    /// A linear axis of time from 0 that ends at the first round number at or above the last.
    pub fn time(label: &str, values: &[f64]) -> Axis {
        Axis::linear(label, Format::Plain, values, 1.0)
    }

    fn linear(label: &str, format: Format, values: &[f64], headroom: f64) -> Axis {
        let max = values
            .iter()
            .copied()
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max);
        let max = if max > 0.0 { max } else { 1.0 };
        let raw = max * headroom / 6.0;
        let magnitude = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 2.5, 5.0, 10.0]
            .iter()
            .map(|m| m * magnitude)
            .find(|s| *s >= raw)
            .unwrap_or(10.0 * magnitude);
        let hi = (max * headroom / step - 1e-9).ceil() * step;
        let count = (hi / step).round() as usize;
        Axis {
            label: label.to_owned(),
            format,
            log: false,
            lo: 0.0,
            hi,
            ticks: (0..=count).map(|i| i as f64 * step).collect(),
            light: (0..count).map(|i| (i as f64 + 0.5) * step).collect(),
            categories: None,
        }
    }

    /// Named positions 0, 1, ...
    pub fn categories(label: &str, names: &[&str]) -> Axis {
        Axis {
            label: label.to_owned(),
            format: Format::Plain,
            log: false,
            lo: -0.4,
            hi: names.len() as f64 - 0.6,
            ticks: (0..names.len()).map(|i| i as f64).collect(),
            light: Vec::new(),
            categories: Some(names.iter().map(|n| (*n).to_owned()).collect()),
        }
    }

    /// The label, with a note when the scale is logarithmic.
    fn description(&self) -> String {
        if self.log {
            format!("{} (log scale)", self.label)
        } else {
            self.label.clone()
        }
    }

    fn to_plot(&self, v: f64) -> f64 {
        if self.log {
            v.log10()
        } else {
            v
        }
    }

    fn text(&self, plot: f64) -> String {
        if let Some(names) = &self.categories {
            let i = plot.round();
            return if i >= 0.0 && (i as usize) < names.len() {
                names[i as usize].clone()
            } else {
                String::new()
            };
        }
        let v = if self.log { 10f64.powf(plot) } else { plot };
        format_value(self.format, v)
    }

    fn coord(&self) -> Scale {
        Scale {
            lo: self.lo,
            hi: self.hi,
            ticks: self.ticks.clone(),
            light: self.light.clone(),
        }
    }
}

/// A linear coordinate in plot units with the ticks (and light grid lines) the axis chose.
struct Scale {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
    light: Vec<f64>,
}

impl Ranged for Scale {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let span = self.hi - self.lo;
        let share = if span > 0.0 {
            (value - self.lo) / span
        } else {
            0.5
        };
        let share = if share.is_finite() {
            share.clamp(-1.0, 2.0)
        } else {
            0.5
        };
        limit.0 + ((limit.1 - limit.0) as f64 * share).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.light.clone()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

/// `v` with at most three significant digits and no trailing zeros.
fn short(v: f64) -> String {
    let digits = if v == 0.0 || v.abs() >= 100.0 {
        0
    } else if v.abs() >= 10.0 {
        1
    } else {
        2
    };
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

fn format_value(format: Format, v: f64) -> String {
    match format {
        Format::Exact if v < 1e4 => format!("{v:.0}"),
        Format::Count | Format::Exact if v >= 1e9 => format!("{}G", short(v / 1e9)),
        Format::Count | Format::Exact if v >= 1e6 => format!("{}M", short(v / 1e6)),
        Format::Count | Format::Exact if v >= 1e3 => format!("{}k", short(v / 1e3)),
        Format::Micros if v >= 1e6 => format!("{} s", short(v / 1e6)),
        Format::Micros if v >= 1e3 => format!("{} ms", short(v / 1e3)),
        Format::Micros => format!("{} µs", short(v)),
        Format::Count | Format::Exact | Format::Bytes | Format::Plain => short(v),
    }
}

/// Splits `text` into lines of at most `width` characters, at spaces.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

#[derive(Debug)]
pub struct Chart {
    pub title: String,
    /// One line of context under the title (wrapped when long).
    pub subtitle: String,
    pub x: Axis,
    pub y: Axis,
    /// A right-hand axis for the series marked `secondary`.
    pub y2: Option<Axis>,
    pub series: Vec<Series>,
    /// Legend entries for line and marker styles, in grey, when the colours name peers and
    /// the styles name workloads.
    pub styles: Vec<(Line, Marker, String)>,
}

/// One entry of the legend: a swatch and a name.
struct Entry {
    color: RGBColor,
    line: Option<Line>,
    marker: Option<Marker>,
    text: String,
}

/// Approximate width in pixels of `text` at the legend's 13 px (16 in plotters' units) (SVG text is laid out by the
/// viewer; this only spaces the entries).
fn text_width(text: &str) -> i32 {
    (text.chars().count() as f64 * 7.2) as i32
}

impl Chart {
    fn legend(&self) -> Vec<Entry> {
        let mut entries: Vec<Entry> = Vec::new();
        for s in &self.series {
            if entries.iter().any(|e| e.text == s.name) {
                continue;
            }
            let by_colour_only = !self.styles.is_empty();
            entries.push(Entry {
                color: PALETTE[s.color % PALETTE.len()],
                line: if by_colour_only { None } else { Some(s.line) },
                marker: if by_colour_only { None } else { Some(s.marker) },
                text: s.name.clone(),
            });
        }
        for (line, marker, text) in &self.styles {
            entries.push(Entry {
                color: GREY,
                line: Some(*line),
                marker: Some(*marker),
                text: text.clone(),
            });
        }
        entries
    }

    /// Writes the chart to `path` as an SVG file of 800 x 480.
    pub fn draw(&self, path: &Path) -> Result<(), Error> {
        let fail = |e: &dyn std::fmt::Display| Error::Draw {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(&e))?;

        // The legend's rows, laid out left to right.
        let entries = self.legend();
        let mut rows: Vec<Vec<(i32, &Entry)>> = vec![Vec::new()];
        let mut x = 0;
        for entry in &entries {
            let w = 36 + text_width(&entry.text) + 18;
            if x > 0 && x + w > WIDTH as i32 - 20 {
                rows.push(Vec::new());
                x = 0;
            }
            if let Some(row) = rows.last_mut() {
                row.push((x, entry));
            }
            x += w;
        }
        let legend_height = 10 + 22 * rows.len() as u32;
        let subtitle = wrap(&self.subtitle, 108);
        let header_height = 40 + 17 * subtitle.len() as u32;

        let (header, rest) = root.split_vertically(header_height);
        let (plot, legend) = rest.split_vertically(HEIGHT - header_height - legend_height);

        header
            .draw(&Text::new(
                self.title.as_str(),
                (12, 8),
                (FONT, 24).into_font().style(FontStyle::Bold),
            ))
            .map_err(|e| fail(&e))?;
        for (i, line) in subtitle.iter().enumerate() {
            header
                .draw(&Text::new(
                    line.as_str(),
                    (12, 38 + 17 * i as i32),
                    (FONT, 16).into_font().color(&GREY),
                ))
                .map_err(|e| fail(&e))?;
        }

        let y2 = self.y2.as_ref().unwrap_or(&self.y);
        let mut chart = ChartBuilder::on(&plot)
            .margin_left(10)
            .margin_right(if self.y2.is_some() { 10 } else { 30 })
            .margin_top(6)
            .x_label_area_size(48)
            .y_label_area_size(84)
            .right_y_label_area_size(if self.y2.is_some() { 76 } else { 0 })
            .build_cartesian_2d(self.x.coord(), self.y.coord())
            .map_err(|e| fail(&e))?
            .set_secondary_coord(self.x.coord(), y2.coord());

        let x_desc = self.x.description();
        let y_desc = self.y.description();
        let x_text = |v: &f64| self.x.text(*v);
        let y_text = |v: &f64| self.y.text(*v);
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_label_formatter(&x_text)
            .y_label_formatter(&y_text)
            .label_style((FONT, 16))
            .axis_desc_style((FONT, 17))
            .bold_line_style(RGBColor(0xcc, 0xcc, 0xcc))
            .light_line_style(RGBColor(0xee, 0xee, 0xee))
            .draw()
            .map_err(|e| fail(&e))?;
        if let Some(y2) = &self.y2 {
            let y2_text = |v: &f64| y2.text(*v);
            chart
                .configure_secondary_axes()
                .y_desc(y2.description())
                .y_label_formatter(&y2_text)
                .label_style((FONT, 16))
                .axis_desc_style((FONT, 17))
                .draw()
                .map_err(|e| fail(&e))?;
        }

        for s in &self.series {
            let color = PALETTE[s.color % PALETTE.len()];
            let y_axis = if s.secondary { y2 } else { &self.y };
            let points: Vec<(f64, f64)> = s
                .points
                .iter()
                .map(|&(x, y)| (self.x.to_plot(x), y_axis.to_plot(y)))
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect();
            let stroke = color.stroke_width(2);
            macro_rules! draw_on {
                ($method:ident) => {{
                    if points.len() > 1 {
                        match s.line {
                            Line::Solid => chart
                                .$method(LineSeries::new(points.clone(), stroke))
                                .map(|_| ()),
                            Line::Dashed => chart
                                .$method(DashedLineSeries::new(points.clone(), 7, 5, stroke))
                                .map(|_| ()),
                        }
                        .map_err(|e| fail(&e))?;
                    }
                    let filled = color.filled();
                    match s.marker {
                        Marker::Circle => chart
                            .$method(points.iter().map(|&p| Circle::new(p, 4, filled)))
                            .map(|_| ()),
                        Marker::Triangle => chart
                            .$method(points.iter().map(|&p| TriangleMarker::new(p, 6, filled)))
                            .map(|_| ()),
                        Marker::Square => chart
                            .$method(points.iter().map(|&p| {
                                EmptyElement::at(p) + Rectangle::new([(-4, -4), (4, 4)], filled)
                            }))
                            .map(|_| ()),
                    }
                    .map_err(|e| fail(&e))?;
                }};
            }
            if s.secondary {
                draw_on!(draw_secondary_series);
            } else {
                draw_on!(draw_series);
            }
        }

        for (r, row) in rows.iter().enumerate() {
            let y = 13 + 22 * r as i32;
            for &(x, entry) in row {
                let x = x + 16;
                draw_swatch(&legend, entry, x, y).map_err(|e| fail(&e))?;
                legend
                    .draw(&Text::new(
                        entry.text.as_str(),
                        (x + 34, y - 8),
                        (FONT, 16).into_font(),
                    ))
                    .map_err(|e| fail(&e))?;
            }
        }
        root.present().map_err(|e| fail(&e))?;
        Ok(())
    }
}

/// The legend's sample of a series at (x, y), 28 px wide.
fn draw_swatch<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    entry: &Entry,
    x: i32,
    y: i32,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let stroke = entry.color.stroke_width(2);
    match entry.line {
        Some(Line::Solid) => area.draw(&PathElement::new(vec![(x, y), (x + 28, y)], stroke))?,
        Some(Line::Dashed) => {
            area.draw(&PathElement::new(vec![(x, y), (x + 9, y)], stroke))?;
            area.draw(&PathElement::new(vec![(x + 19, y), (x + 28, y)], stroke))?;
        }
        None => area.draw(&Rectangle::new(
            [(x, y - 5), (x + 28, y + 5)],
            entry.color.filled(),
        ))?,
    }
    let filled = entry.color.filled();
    let centre = (x + 14, y);
    match entry.marker {
        Some(Marker::Circle) => area.draw(&Circle::new(centre, 4, filled))?,
        Some(Marker::Triangle) => area.draw(&TriangleMarker::new(centre, 6, filled))?,
        Some(Marker::Square) => {
            area.draw(&Rectangle::new([(x + 10, y - 4), (x + 18, y + 4)], filled))?
        }
        None => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values() {
        assert_eq!(format_value(Format::Count, 16_300.0), "16.3k");
        assert_eq!(format_value(Format::Count, 2_000_000.0), "2M");
        assert_eq!(format_value(Format::Micros, 573.0), "573 µs");
        assert_eq!(format_value(Format::Micros, 1_620.0), "1.62 ms");
        assert_eq!(format_value(Format::Plain, 0.0), "0");
        assert_eq!(format_value(Format::Exact, 1024.0), "1024");
        assert_eq!(format_value(Format::Exact, 200_000.0), "200k");
    }

    #[test]
    fn log_axis_ticks_at_decades() {
        let a = Axis::fit("x", Format::Count, [2_000.0, 600_000.0].into_iter());
        assert!(a.log);
        assert_eq!(a.lo, 3.0);
        assert_eq!(a.hi, 6.0);
        let b = Axis::fit("x", Format::Count, [200.0, 400.0].into_iter());
        assert!(!b.log);
        assert_eq!(b.lo, 0.0);
        assert!(b.hi >= 400.0);
    }

    #[test]
    fn wrapping() {
        assert_eq!(wrap("a bb ccc", 4), vec!["a bb", "ccc"]);
    }
}
