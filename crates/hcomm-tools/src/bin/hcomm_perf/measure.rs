//! The one measurement loop of every operation: untimed warm-up iterations that estimate the
//! time of one, then samples taken back to back, of which the median is reported.

use std::time::Instant;

/// Runs `warmup` untimed iterations; returns the mean seconds of those after the first (the
/// first pays for connections and caches), 0 when there are fewer than two.
pub(super) fn warm_up(
    warmup: u64,
    mut iteration: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let mut since_first = None;
    for i in 0..warmup {
        if i == 1 {
            since_first = Some(Instant::now());
        }
        iteration()?;
    }
    Ok(match since_first {
        Some(t) => t.elapsed().as_secs_f64() / (warmup - 1) as f64,
        None => 0.0,
    })
}

/// The median of `samples` values of `sample` taken back to back (0 when there are none).
pub(super) fn median_of(
    samples: u64,
    mut sample: impl FnMut() -> anyhow::Result<f64>,
) -> anyhow::Result<f64> {
    let mut values = Vec::with_capacity(usize::try_from(samples.min(1 << 20)).unwrap_or(0));
    for _ in 0..samples {
        values.push(sample()?);
    }
    values.sort_by(f64::total_cmp);
    Ok(values.get(values.len() / 2).copied().unwrap_or(0.0))
}

/// The median seconds of `iters` iterations, each timed on its own, back to back.
pub(super) fn median_time(
    iters: u64,
    mut iteration: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    median_of(iters, || {
        let t = Instant::now();
        iteration()?;
        Ok(t.elapsed().as_secs_f64())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_sample() {
        let mut next = [5.0, 1.0, 4.0, 2.0, 3.0].into_iter();
        let m = median_of(5, || Ok(next.next().unwrap())).unwrap();
        assert_eq!(m, 3.0);
        assert_eq!(median_of(0, || Ok(1.0)).unwrap(), 0.0);
    }

    #[test]
    fn warm_up_runs_every_iteration_and_skips_the_first_in_the_estimate() {
        let mut calls = 0;
        let per = warm_up(3, || {
            calls += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(calls, 3);
        assert!(per >= 0.0);
        assert_eq!(warm_up(1, || Ok(())).unwrap(), 0.0);
    }
}
