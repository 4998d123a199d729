//! PNG plots of `sessionbox bench`'s concurrency measurements (plotters): latency p50 and p99
//! against concurrency, and throughput against concurrency, one line per runtime and path.
//!
//! Text needs a font: the first of a few usual system fonts (DejaVu Sans, Liberation Sans) is
//! loaded at run time. Without one, no plot is drawn and the report says why.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::FontStyle;

/// One line: a label and its (concurrency, value) points.
pub(crate) struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Registers a system font as `sans-serif` once; the path used, or why none could be.
fn font() -> Result<&'static Path, String> {
    static FONT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FONT.get_or_init(|| {
        for p in FONTS {
            if let Ok(bytes) = std::fs::read(p) {
                // The font must live as long as plotters' registry: for the process.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Ok(PathBuf::from(p));
                }
            }
        }
        Err(format!(
            "no usable font (looked for {}); install fonts-dejavu-core",
            FONTS.join(", ")
        ))
    })
    .as_ref()
    .map(PathBuf::as_path)
    .map_err(Clone::clone)
}

/// Draws `series` against concurrency (log scale) into the PNG `out`.
///
/// # Errors
/// No font, or drawing or writing failed: the message says which.
pub(crate) fn plot(
    out: &Path,
    title: &str,
    y_label: &str,
    series: &[Series],
) -> Result<(), String> {
    font()?;
    let points = series.iter().flat_map(|s| s.points.iter());
    let (x_max, y_max) = points.fold((1.0f64, 0.0f64), |(x, y), p| (x.max(p.0), y.max(p.1)));
    let root = BitMapBackend::new(out, (960, 600)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| format!("drawing {}: {e}", out.display());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(
            (1.0f64..x_max * 1.2).log_scale(),
            0.0f64..(y_max * 1.1).max(1e-3),
        )
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("concurrent conversations")
        .y_desc(y_label)
        .draw()
        .map_err(|x| e(&x))?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|x| e(&x))?
            .label(s.label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(s.points.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(|x| e(&x))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plot_is_a_png_of_the_requested_size() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("p.png");
        let s = [Series {
            label: "isolated (library)".into(),
            points: vec![(1.0, 1.5), (8.0, 4.0), (64.0, 30.0)],
        }];
        match plot(&out, "latency", "p50 ms", &s) {
            Ok(()) => {
                let bytes = std::fs::read(&out).unwrap();
                assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
                // IHDR: width and height, big-endian, at bytes 16..24.
                assert_eq!(u32::from_be_bytes(bytes[16..20].try_into().unwrap()), 960);
                assert_eq!(u32::from_be_bytes(bytes[20..24].try_into().unwrap()), 600);
            }
            // A machine without any of the fonts: the error says what to install.
            Err(e) => assert!(e.contains("fonts-dejavu-core"), "{e}"),
        }
    }
}
