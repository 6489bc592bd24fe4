//! Datasets made in code, reproducible from a seed: half-moons, concentric circles, spirals, and
//! a small image-like classification set (bars, crosses and diagonals on a noisy grid).

use arrayjit_ir::fallible::{try_collect, try_vec_filled, try_vec_with_capacity};
use arrayjit_ir::{Error, Result};

use crate::rng::Philox;

/// Points (or images) with class labels.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// Row-major `[n, features]`.
    pub x: Vec<f64>,
    /// Class of each row, in `0..classes`.
    pub labels: Vec<usize>,
    /// Features per row.
    pub features: usize,
    /// Number of classes.
    pub classes: usize,
}

impl Dataset {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Labels as `±1` (for two classes: class 1 is `+1`).
    pub fn signed_labels(&self) -> Vec<f64> {
        self.labels
            .iter()
            .map(|&l| if l == 1 { 1.0 } else { -1.0 })
            .collect()
    }

    /// Labels one-hot encoded, row-major `[n, classes]`.
    pub fn one_hot(&self) -> Result<Vec<f64>> {
        let n = checked_size("one_hot", &[self.len(), self.classes])?;
        let mut out = try_vec_filled(n, 0.0, || format!("a one-hot encoding of {n} values"))?;
        for (i, &l) in self.labels.iter().enumerate() {
            if let Some(v) = out.get_mut(i * self.classes + l) {
                *v = 1.0;
            }
        }
        Ok(out)
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f64] {
        &self.x[i * self.features..(i + 1) * self.features]
    }

    /// A shuffled split into `(train, test)` with `train_fraction` of the rows in `train`.
    pub fn split(&self, train_fraction: f64, seed: u64) -> Result<(Dataset, Dataset)> {
        if !(0.0..=1.0).contains(&train_fraction) {
            return Err(Error::BadValue {
                what: "train fraction".into(),
                value: train_fraction.to_string(),
                expected: "a number between 0 and 1".into(),
            });
        }
        let rng = Philox::new(seed, 0x5eed);
        let mut order: Vec<usize> = (0..self.len()).collect();
        // Fisher–Yates with the counter-based generator.
        for i in (1..order.len()).rev() {
            let j = (rng.uniform(i as u64) * (i + 1) as f64) as usize;
            order.swap(i, j.min(i));
        }
        let cut = (self.len() as f64 * train_fraction).round() as usize;
        let pick = |idx: &[usize]| -> Result<Dataset> {
            let values = idx.len() * self.features;
            Ok(Dataset {
                x: try_collect(
                    values,
                    idx.iter().flat_map(|&i| self.row(i).iter().copied()),
                    || format!("a split of {values} values"),
                )?,
                labels: idx.iter().map(|&i| self.labels[i]).collect(),
                features: self.features,
                classes: self.classes,
            })
        };
        Ok((pick(&order[..cut])?, pick(&order[cut..])?))
    }

    /// Whole batches of `batch_size` rows: `(x [batches, batch_size, features], rows used)`;
    /// the remainder is dropped.
    pub fn batches(&self, batch_size: usize) -> Result<(usize, Vec<f64>)> {
        if batch_size == 0 || batch_size > self.len() {
            return Err(Error::BadValue {
                what: "batch size".into(),
                value: batch_size.to_string(),
                expected: format!("1 to the dataset's {} rows", self.len()),
            });
        }
        let n = self.len() / batch_size;
        let used = &self.x[..n * batch_size * self.features];
        let copy = try_collect(used.len(), used.iter().copied(), || {
            format!("{} batched values", used.len())
        })?;
        Ok((n, copy))
    }
}

/// The product of `factors`, or an error naming the dataset when it overflows.
fn checked_size(name: &str, factors: &[usize]) -> Result<usize> {
    factors
        .iter()
        .try_fold(1usize, |acc, &f| acc.checked_mul(f))
        .ok_or_else(|| Error::OutOfMemory {
            what: format!("{name}: {factors:?} values"),
            bytes: usize::MAX,
        })
}

/// Empty storage for `rows` rows of `features` values and their labels, allocated fallibly.
fn storage(name: &str, rows: usize, features: usize) -> Result<(Vec<f64>, Vec<usize>)> {
    let values = checked_size(name, &[rows, features])?;
    let x = try_vec_with_capacity(values, || {
        format!("{name}: {rows} rows of {features} values")
    })?;
    let labels = try_vec_with_capacity(rows, || format!("{name}: labels of {rows} rows"))?;
    Ok((x, labels))
}

/// Two interleaving half circles ("moons") with Gaussian noise of standard deviation `noise`.
pub fn moons(n: usize, noise: f64, seed: u64) -> Result<Dataset> {
    let rng = Philox::new(seed, 1);
    let (mut x, mut labels) = storage("moons", n, 2)?;
    let upper = n / 2;
    for i in 0..n {
        let (class, k, count) = if i < upper {
            (0, i, upper)
        } else {
            (1, i - upper, n - upper)
        };
        let t = std::f64::consts::PI * k as f64 / (count.max(2) - 1) as f64;
        let (px, py) = if class == 0 {
            (t.cos(), t.sin())
        } else {
            (1.0 - t.cos(), 0.5 - t.sin())
        };
        x.push(px + noise * rng.normal(2 * i as u64));
        x.push(py + noise * rng.normal(2 * i as u64 + 1));
        labels.push(class);
    }
    Ok(Dataset {
        x,
        labels,
        features: 2,
        classes: 2,
    })
}

/// Two concentric circles; the inner one has radius `factor`.
pub fn circles(n: usize, noise: f64, factor: f64, seed: u64) -> Result<Dataset> {
    let rng = Philox::new(seed, 2);
    let (mut x, mut labels) = storage("circles", n, 2)?;
    for i in 0..n {
        let class = i % 2;
        let r = if class == 0 { 1.0 } else { factor };
        let t = std::f64::consts::TAU * rng.uniform(3 * i as u64);
        x.push(r * t.cos() + noise * rng.normal(3 * i as u64 + 1));
        x.push(r * t.sin() + noise * rng.normal(3 * i as u64 + 2));
        labels.push(class);
    }
    Ok(Dataset {
        x,
        labels,
        features: 2,
        classes: 2,
    })
}

/// `classes` interleaved spiral arms of `per_class` points each.
pub fn spirals(per_class: usize, classes: usize, noise: f64, seed: u64) -> Result<Dataset> {
    let rng = Philox::new(seed, 3);
    let rows = checked_size("spirals", &[per_class, classes])?;
    let (mut x, mut labels) = storage("spirals", rows, 2)?;
    for c in 0..classes {
        for k in 0..per_class {
            let r = k as f64 / per_class as f64;
            let t = c as f64 * std::f64::consts::TAU / classes as f64 + 4.0 * r;
            let i = (c * per_class + k) as u64;
            x.push(r * t.sin() + noise * rng.normal(2 * i));
            x.push(r * t.cos() + noise * rng.normal(2 * i + 1));
            labels.push(c);
        }
    }
    Ok(Dataset {
        x,
        labels,
        features: 2,
        classes,
    })
}

/// Small `size × size` grey images in four classes — horizontal bar, vertical bar, cross,
/// diagonal — at random positions with pixel noise; flattened to `size²` features.
pub fn bars_and_crosses(n: usize, size: usize, noise: f64, seed: u64) -> Result<Dataset> {
    let rng = Philox::new(seed, 4);
    let features = checked_size("bars_and_crosses", &[size, size])?;
    let (mut x, mut labels) = storage("bars_and_crosses", n, features)?;
    for i in 0..n {
        let class = i % 4;
        let pos = 1 + (rng.uniform(2 * i as u64) * (size.max(3) - 2) as f64) as usize;
        for r in 0..size {
            for c in 0..size {
                let on = match class {
                    0 => r == pos,
                    1 => c == pos,
                    2 => r == pos || c == pos,
                    _ => r == c,
                };
                let p = (i * size * size + r * size + c) as u64;
                x.push(if on { 1.0 } else { 0.0 } + noise * rng.normal(1_000_000 + p));
            }
        }
        labels.push(class);
    }
    Ok(Dataset {
        x,
        labels,
        features: size * size,
        classes: 4,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datasets_are_reproducible_and_well_formed() {
        assert_eq!(moons(100, 0.1, 3).unwrap(), moons(100, 0.1, 3).unwrap());
        assert_ne!(moons(100, 0.1, 3).unwrap(), moons(100, 0.1, 4).unwrap());
        for d in [
            moons(50, 0.1, 1).unwrap(),
            circles(50, 0.05, 0.5, 1).unwrap(),
            spirals(20, 3, 0.0, 1).unwrap(),
            bars_and_crosses(12, 6, 0.1, 1).unwrap(),
        ] {
            assert_eq!(d.x.len(), d.len() * d.features);
            assert!(d.labels.iter().all(|&l| l < d.classes));
        }
        let (train, test) = moons(100, 0.1, 1).unwrap().split(0.8, 9).unwrap();
        assert_eq!((train.len(), test.len()), (80, 20));
        assert!(moons(10, 0.1, 1).unwrap().split(1.5, 0).is_err());
        let (nb, xs) = moons(10, 0.1, 1).unwrap().batches(3).unwrap();
        assert_eq!((nb, xs.len()), (3, 18));
        assert_eq!(
            moons(4, 0.0, 1).unwrap().one_hot().unwrap(),
            vec![1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
        );
    }

    /// Reliability issue, item 5: sizes the machine cannot hold are typed errors, not aborts.
    #[test]
    fn item05_impossible_dataset_sizes_are_errors() {
        assert!(moons(usize::MAX / 4, 0.1, 1).is_err_and(|e| e.is_out_of_memory()));
        assert!(bars_and_crosses(1 << 40, 1 << 20, 0.1, 1).is_err_and(|e| e.is_out_of_memory()));
        assert!(spirals(usize::MAX, 2, 0.0, 1).is_err());
    }
}
