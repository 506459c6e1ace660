//! The picture of a run (SVG): above, grants per second over the whole run with every fault
//! shaded; below, a window of a dozen TTLs around the first server fault (or the first
//! violation) showing who believed they held each name, when. Violations are red lines.

use std::path::Path;
use std::time::{Duration, Instant};

use plotters::prelude::*;

use super::belief::belief_spans;
use super::history::{fault_spans, Event, Op, NOBODY};
use super::report::Report;
use lock_core::BoxError;

/// A fault from its start to its heal.
struct Shade {
    from: f64,
    to: f64,
    server: bool,
}

/// Fault spans in seconds since `origin` (an unhealed one runs to `end`).
fn shades(events: &[Event], origin: Instant, end: f64) -> Vec<Shade> {
    let secs = |t: Instant| t.saturating_duration_since(origin).as_secs_f64();
    fault_spans(events)
        .into_iter()
        .map(|(fault, heal)| Shade {
            from: secs(fault.at),
            to: heal.map_or(end, |h| secs(h.at)),
            server: fault.client == NOBODY,
        })
        .collect()
}

/// Draws `report`'s history to `path` (SVG). `names` and `clients` are the workload's;
/// `ttl` sizes the detail window.
pub fn draw(
    report: &Report,
    title: &str,
    names: usize,
    clients: usize,
    ttl: Duration,
    path: &Path,
) -> Result<(), BoxError> {
    let events = &report.events;
    let (Some(first), Some(last)) = (events.first(), events.last()) else {
        return Err("an empty history has no picture".into());
    };
    let origin = first.at;
    let secs = |t: Instant| t.saturating_duration_since(origin).as_secs_f64();
    let end = secs(last.at).max(0.001);
    let shades = shades(events, origin, end);
    let violations: Vec<f64> = report.violations.iter().map(|v| secs(v.at)).collect();

    // Grants per second.
    let buckets = end.ceil().max(1.0) as usize;
    let mut per_second = vec![0u32; buckets];
    for e in events {
        if matches!(e.op, Op::Granted { .. }) {
            let i = (secs(e.at) as usize).min(buckets - 1);
            per_second[i] += 1;
        }
    }
    let peak = per_second.iter().copied().max().unwrap_or(1).max(1);

    // The detail window: around the first violation, else the first server fault, else the
    // first fault, else the start.
    let focus = violations
        .first()
        .copied()
        .or_else(|| shades.iter().find(|s| s.server).map(|s| s.from))
        .or_else(|| shades.first().map(|s| s.from))
        .unwrap_or(0.0);
    let t = ttl.as_secs_f64();
    let w0 = (focus - 2.0 * t).max(0.0);
    let w1 = (w0 + 12.0 * t).min(end);

    let root = SVGBackend::new(path, (1200, 760)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(280);

    let mut rate = ChartBuilder::on(&top)
        .caption(
            format!("{title}: grants per second, faults shaded (red: server, orange: client)"),
            ("sans-serif", 16),
        )
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(48)
        .build_cartesian_2d(0.0..end, 0.0..f64::from(peak) * 1.1)?;
    rate.configure_mesh()
        .x_desc("seconds")
        .disable_mesh()
        .draw()?;
    let top_y = f64::from(peak) * 1.1;
    rate.draw_series(shades.iter().map(|s| {
        let color = if s.server {
            RED.mix(0.25)
        } else {
            RGBColor(255, 140, 0).mix(0.12)
        };
        Rectangle::new(
            [(s.from, 0.0), (s.to.max(s.from + end / 2000.0), top_y)],
            color.filled(),
        )
    }))?;
    rate.draw_series(LineSeries::new(
        per_second
            .iter()
            .enumerate()
            .map(|(i, n)| (i as f64 + 0.5, f64::from(*n))),
        BLUE.stroke_width(1),
    ))?;
    rate.draw_series(
        violations
            .iter()
            .map(|v| PathElement::new(vec![(*v, 0.0), (*v, top_y)], RED.stroke_width(2))),
    )?;
    // The window shown below.
    rate.draw_series(std::iter::once(Rectangle::new(
        [(w0, 0.0), (w1, top_y)],
        BLACK.stroke_width(1),
    )))?;

    let lanes = names.max(1) as f64;
    let mut detail = ChartBuilder::on(&bottom)
        .caption(
            format!(
                "holders from {w0:.1} s to {w1:.1} s: one lane per name, one colour per client"
            ),
            ("sans-serif", 16),
        )
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(48)
        .build_cartesian_2d(w0..w1, 0.0..lanes)?;
    detail
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("name")
        .y_labels(names.min(16))
        .disable_mesh()
        .draw()?;
    detail.draw_series(
        shades
            .iter()
            .filter(|s| s.to >= w0 && s.from <= w1)
            .map(|s| {
                let color = if s.server {
                    RED.mix(0.25)
                } else {
                    RGBColor(255, 140, 0).mix(0.15)
                };
                Rectangle::new(
                    [(s.from.max(w0), 0.0), (s.to.min(w1), lanes)],
                    color.filled(),
                )
            }),
    )?;
    let end_at = last.at;
    let spans = belief_spans(events, end_at);
    detail.draw_series(
        spans
            .iter()
            .map(|&(c, n, s, e)| (c, n, secs(s), secs(e)))
            .filter(|&(_, n, s, e)| e >= w0 && s <= w1 && n != NOBODY)
            .map(|(c, n, s, e)| {
                let color = Palette99::pick(c % clients.max(1)).filled();
                let y = n as f64;
                Rectangle::new([(s.max(w0), y + 0.15), (e.min(w1), y + 0.85)], color)
            }),
    )?;
    detail.draw_series(
        violations
            .iter()
            .filter(|v| **v >= w0 && **v <= w1)
            .map(|v| PathElement::new(vec![(*v, 0.0), (*v, lanes)], RED.stroke_width(2))),
    )?;
    root.present()?;
    Ok(())
}
