//! The overview's messages-per-minute chart: bars of an inline SVG,
//! computed on the server so the page needs no script to draw it.

/// The chart's drawing area, in SVG units.
pub const WIDTH: u32 = 600;
/// The chart's height, in SVG units.
pub const HEIGHT: u32 = 120;

/// One bar: its box and the count it stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bar {
    /// Left edge.
    pub x: u32,
    /// Top edge.
    pub y: u32,
    /// Width.
    pub w: u32,
    /// Height.
    pub h: u32,
    /// The count.
    pub n: u64,
    /// Minutes before now (0: the current minute).
    pub ago: usize,
}

/// Bars for `series` (oldest first), scaled to the highest value, and
/// that value.
pub fn bars(series: &[u64]) -> (Vec<Bar>, u64) {
    let peak = series.iter().copied().max().unwrap_or(0);
    let n = series.len().max(1) as u32;
    let w = (WIDTH / n).max(1);
    let bars = series
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let h = if peak == 0 {
                0
            } else {
                ((v as f64 / peak as f64) * f64::from(HEIGHT)).round() as u32
            };
            Bar {
                x: i as u32 * w,
                y: HEIGHT - h,
                w: w.saturating_sub(1).max(1),
                h,
                n: v,
                ago: series.len() - 1 - i,
            }
        })
        .collect();
    (bars, peak)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_the_peak() {
        let (b, peak) = bars(&[0, 5, 10]);
        assert_eq!(peak, 10);
        assert_eq!(b.len(), 3);
        assert_eq!((b[0].h, b[1].h, b[2].h), (0, HEIGHT / 2, HEIGHT));
        assert_eq!(b[2].y, 0);
        assert_eq!((b[0].ago, b[2].ago), (2, 0));
        assert_eq!(b[1].x, WIDTH / 3);
        let (b, peak) = bars(&[0, 0]);
        assert_eq!(peak, 0);
        assert!(b.iter().all(|b| b.h == 0 && b.y == HEIGHT));
    }
}
