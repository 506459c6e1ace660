//! The pictures of `--scale`: each figure against the number of held locks (log scale), one
//! line per backend, as SVG files for BENCHMARKS.md.

use std::path::Path;

use plotters::prelude::*;

use crate::scale::ScaleRow;

/// One picture: a figure of the rows, its file stem and its axis label.
struct Figure {
    stem: &'static str,
    label: &'static str,
    value: fn(&ScaleRow) -> Option<f64>,
}

const FIGURES: [Figure; 5] = [
    Figure {
        stem: "scale-connections",
        label: "server connections added",
        value: |r| r.connections.map(|c| c as f64),
    },
    Figure {
        stem: "scale-rss",
        label: "client RSS per held lock, KiB",
        value: |r| r.rss_kib_per_lock,
    },
    Figure {
        stem: "scale-renewals",
        label: "renewals per second per held lock",
        value: |r| r.renewals_per_sec_per_lock,
    },
    Figure {
        stem: "scale-requests",
        label: "server requests per second per held lock",
        value: |r| r.requests_per_sec_per_lock,
    },
    Figure {
        stem: "scale-cycle-p99",
        label: "acquire + release p99 while held, ms",
        value: |r| r.cycle_p99_us.map(|us| us / 1e3),
    },
];

/// Writes the five pictures of `rows` into `dir` (`scale-*.svg`).
pub(crate) fn draw(rows: &[ScaleRow], dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let mut backends: Vec<&str> = rows.iter().map(|r| r.backend.as_str()).collect();
    backends.dedup();
    for fig in &FIGURES {
        let path = dir.join(format!("{}.svg", fig.stem));
        one(rows, &backends, fig, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

fn one(
    rows: &[ScaleRow],
    backends: &[&str],
    fig: &Figure,
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let points = |b: &str| -> Vec<(f64, f64)> {
        rows.iter()
            .filter(|r| r.backend == b && r.error.is_none())
            .filter_map(|r| Some((r.held as f64, (fig.value)(r)?)))
            .collect()
    };
    let all: Vec<(f64, f64)> = backends.iter().flat_map(|b| points(b)).collect();
    let x_max = all.iter().map(|p| p.0).fold(10.0, f64::max);
    let y_max = all.iter().map(|p| p.1).fold(1.0, f64::max) * 1.1;
    let root = SVGBackend::new(path, (720, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(fig.label, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d((1.0..x_max * 1.5).log_scale(), 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("locks held by one client")
        .draw()?;
    for (i, b) in backends.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points(b), color.stroke_width(2)))?
            .label(*b)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        chart.draw_series(
            points(b)
                .into_iter()
                .map(|p| Circle::new(p, 3, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
