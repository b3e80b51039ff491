//! The grouped bar chart.

use super::*;

/// Width of one group's slot on the bar chart's integer x axis.
const SLOT: i32 = 1000;

/// A grouped bar chart with its data cleaned.
pub(super) struct Bars<'a> {
    /// Chart title.
    title: &'a str,
    /// Y axis description.
    y_label: &'a str,
    /// Name of each way (generated for values beyond the given names).
    ways: Vec<String>,
    /// Groups with at least one finite value.
    groups: Vec<&'a BarGroup>,
}

impl<'a> Bars<'a> {
    /// Cleans the caller's groups.
    pub(super) fn new(
        title: &'a str,
        y_label: &'a str,
        ways: &[&str],
        groups: &'a [BarGroup],
    ) -> Self {
        let groups: Vec<&BarGroup> = groups
            .iter()
            .filter(|g| g.values.iter().any(|v| v.is_finite()))
            .collect();
        let n_ways = groups
            .iter()
            .map(|g| g.values.len())
            .max()
            .unwrap_or(0)
            .max(ways.len());
        let ways = (0..n_ways)
            .map(|j| {
                ways.get(j)
                    .map_or_else(|| format!("#{}", j + 1), |w| (*w).to_string())
            })
            .collect();
        Bars {
            title,
            y_label,
            ways,
            groups,
        }
    }

    /// Finite value of way `j` in group `g`, if any.
    fn value(g: &BarGroup, j: usize) -> Option<f64> {
        g.values.get(j).copied().filter(|v| v.is_finite())
    }

    /// Draws the chart.
    pub(super) fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> Result<(), String> {
        if self.groups.is_empty() {
            return draw_no_data(root, self.title);
        }
        let values = || {
            self.groups
                .iter()
                .flat_map(|g| g.values.iter().copied().filter(|v| v.is_finite()))
        };
        let v_min = values().fold(0.0, f64::min);
        let v_max = values().fold(0.0, f64::max);
        let y_lo = v_min * 1.1;
        let y_hi = if v_max > 0.0 {
            v_max * 1.3
        } else if v_min < 0.0 {
            0.0
        } else {
            1.0
        };

        // x is in thousandths of a group slot (integer, so plotters can
        // format the custom key points): group i is centred on i * SLOT.
        let n = self.groups.len();
        let k = self.ways.len().max(1);
        let centres: Vec<i32> = (0..n).map(|i| i as i32 * SLOT).collect();
        let mut chart = chart_builder(root, self.title, 75)
            .build_cartesian_2d(
                (-SLOT / 2..n as i32 * SLOT - SLOT / 2).with_key_points(centres),
                y_lo..y_hi,
            )
            .map_err(err)?;
        let group_label = |v: &i32| {
            let i = (*v + SLOT / 2).div_euclid(SLOT);
            usize::try_from(i)
                .ok()
                .and_then(|i| self.groups.get(i))
                .map_or_else(String::new, |g| g.label.clone())
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .y_max_light_lines(1)
            .y_desc(self.y_label)
            .x_label_formatter(&group_label)
            .y_label_formatter(&|v| fmt_tick(*v))
            .bold_line_style(GRID_BOLD)
            .light_line_style(GRID_LIGHT)
            .axis_desc_style(axis_desc_style())
            .label_style((FAMILY, 15).into_font().color(&BLACK))
            .draw()
            .map_err(err)?;

        // Each group takes 80 % of its slot; bars have a small gap between them.
        let width = SLOT * 4 / 5 / k as i32;
        let gap = width / 12;
        let plot_px = f64::from(chart.plotting_area().dim_in_pixel().0);
        let show_values = plot_px / n as f64 * f64::from(width) / f64::from(SLOT) >= 40.0;
        for (j, way) in self.ways.iter().enumerate() {
            let col = colour(j);
            let bars: Vec<(i32, i32, f64)> = self
                .groups
                .iter()
                .enumerate()
                .filter_map(|(i, g)| {
                    let v = Self::value(g, j)?;
                    let x0 = i as i32 * SLOT - SLOT * 2 / 5 + j as i32 * width;
                    Some((x0 + gap, x0 + width - gap, v))
                })
                .collect();
            if bars.is_empty() {
                continue;
            }
            chart
                .draw_series(
                    bars.iter()
                        .map(|&(x0, x1, v)| Rectangle::new([(x0, 0.0), (x1, v)], col.filled())),
                )
                .map_err(err)?
                .label(way.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], col.filled()));
            if show_values {
                for &(x0, x1, v) in &bars {
                    let (dy, vpos) = if v >= 0.0 {
                        (-3, VPos::Bottom)
                    } else {
                        (3, VPos::Top)
                    };
                    let style = (FAMILY, 12)
                        .into_font()
                        .color(&RGBColor(50, 50, 50))
                        .pos(Pos::new(HPos::Center, vpos));
                    chart
                        .plotting_area()
                        .draw(
                            &(EmptyElement::at(((x0 + x1) / 2, v))
                                + Text::new(fmt_num(v), (0, dy), style)),
                        )
                        .map_err(err)?;
                }
            }
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperRight)
    }
}
