//! A table (`table`) turned into what the model trains on: a feature matrix and a target per split.
//!
//! * Features are laid out numeric columns first, then each categorical column's one-hot block, then the
//!   date columns' features (`dates::DateFeatures`), each in the order the schema lists them.
//! * The first `train_fraction` of the rows (rounded to the nearest row, at least one row on each side)
//!   trains, the rest tests: of a seeded shuffle of the rows, or in file order (`SplitOrder`). Category
//!   vocabularies come from the training rows only; a category first seen in the test rows is all zeros.
//! * Validation rows (`Dataset::hold_out`) are the last of the training rows, carved out before the
//!   statistics are taken.
//! * `Stats` holds the training split's mean and (population) standard deviation of every feature and of
//!   the target; a constant column gets std 1.

use super::table::{LoadOptions, Row, Table};
use crate::ops::cpu::SeededRng;
use anyhow::{Result, bail};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use std::borrow::Borrow;
use std::collections::HashMap;
use std::path::Path;

/// Features and targets of one split, in the units of the file (or normalised, after `Stats::normalize`).
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    /// Number of rows.
    pub rows: usize,
    /// Features per row.
    pub features: usize,
    /// rows × features, row-major.
    pub x: Vec<f32>,
    /// The target of each row.
    pub y: Vec<f32>,
    /// The file line of each row.
    pub lines: Vec<u64>,
}

impl Split {
    /// The feature rows of `rows` (rows of `table`): numeric values, each categorical column one-hot over
    /// `vocabularies` (a value outside it: all zeros), then the date features.
    pub fn of_rows<R: Borrow<Row>>(table: &Table, rows: &[R], vocabularies: &[Vec<String>]) -> Split {
        let slots: Vec<Vec<Option<usize>>> = table
            .levels
            .iter()
            .zip(vocabularies)
            .map(|(levels, vocabulary)| {
                let slot: HashMap<&str, usize> = vocabulary.iter().enumerate().map(|(s, v)| (v.as_str(), s)).collect();
                levels.iter().map(|l| slot.get(l.as_str()).copied()).collect()
            })
            .collect();
        let date_features: usize = table.date_features.iter().map(|f| f.count()).sum();
        let features = table.columns.numeric.len() + vocabularies.iter().map(Vec::len).sum::<usize>() + date_features;
        let mut x = vec![0.0f32; rows.len() * features];
        for (row, out) in rows.iter().map(Borrow::borrow).zip(x.chunks_exact_mut(features.max(1))) {
            let row: &Row = row;
            let (numeric, rest) = out.split_at_mut(row.numeric.len());
            numeric.copy_from_slice(&row.numeric);
            let mut at = 0;
            for (k, vocabulary) in vocabularies.iter().enumerate() {
                if let Some(s) = slots[k][row.categories[k] as usize] {
                    rest[at + s] = 1.0;
                }
                at += vocabulary.len();
            }
            rest[at..].copy_from_slice(&row.dates);
        }
        Split {
            rows: rows.len(),
            features,
            x,
            y: rows.iter().map(|r| r.borrow().target).collect(),
            lines: rows.iter().map(|r| r.borrow().line).collect(),
        }
    }

    /// The features of row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.x[i * self.features..][..self.features]
    }

    /// Whether the split has no row.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Leaves the first `at` rows here and returns the rest.
    pub fn split_off(&mut self, at: usize) -> Split {
        let rest = Split {
            rows: self.rows - at,
            features: self.features,
            x: self.x.split_off(at * self.features),
            y: self.y.split_off(at),
            lines: self.lines.split_off(at),
        };
        self.rows = at;
        rest
    }
}

/// A table turned into features: both splits in the file's units.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// The file name as given.
    pub source: String,
    /// Bad rows dropped while reading (with `skip_bad_rows`), and the first of them as an error message.
    pub skipped: usize,
    /// The first bad row dropped, as an error message.
    pub first_skipped: Option<String>,
    /// Per feature: the column name, "name=value" for a one-hot entry, "name (year)" and so on for a date
    /// (`DateFeatures::feature_names`).
    pub feature_names: Vec<String>,
    /// The target column's name.
    pub target_name: String,
    /// Per categorical column, its vocabulary (the values of the training rows, in order of appearance):
    /// entry v is one-hot feature v of that column's block.
    pub vocabularies: Vec<Vec<String>>,
    /// The rows that train.
    pub train: Split,
    /// Rows held out of `train` to choose an epoch by (`hold_out`); none by default.
    pub val: Split,
    /// The rows that test.
    pub test: Split,
}

/// Which rows train: the first of the file, or the first of a seeded shuffle of them.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SplitOrder {
    /// Rows in a shuffled order (seeded by --seed), so a sorted table splits as a random one
    #[default]
    Shuffled,
    /// Rows in file order: the first --split train, the rest test (for time series)
    File,
}

impl SplitOrder {
    /// The `--split-order` value, "shuffled" or "file".
    pub fn name(self) -> &'static str {
        match self {
            SplitOrder::Shuffled => "shuffled",
            SplitOrder::File => "file",
        }
    }
}

impl Dataset {
    /// Splits `table`: the first `train_fraction` of its rows (rounded to the nearest row, but leaving at
    /// least one row on each side) train, in file order or in the order of a shuffle seeded by `seed`.
    pub fn from_table(table: &Table, train_fraction: f64, order: SplitOrder, seed: u64) -> Result<Dataset> {
        Dataset::from_table_with(table, train_fraction, order, seed, None)
    }

    /// `from_table`, with the one-hot vocabularies given (a model's, to go on training it) instead of
    /// taken from the training rows.
    pub fn from_table_with(
        table: &Table,
        train_fraction: f64,
        order: SplitOrder,
        seed: u64,
        vocabularies: Option<&[Vec<String>]>,
    ) -> Result<Dataset> {
        if !(train_fraction.is_finite() && train_fraction > 0.0 && train_fraction < 1.0) {
            bail!("the training share of the rows must be between 0 and 1 (exclusive), got {train_fraction}");
        }
        let n = table.rows.len();
        if n < 2 {
            bail!("{}: only 1 usable row, too few to split: at least one row must train and one test", table.source);
        }
        let n_train = ((n as f64 * train_fraction).round() as usize).clamp(1, n - 1);
        let mut rows: Vec<&Row> = table.rows.iter().collect();
        if order == SplitOrder::Shuffled {
            rows.shuffle(&mut SeededRng::seed_from_u64(seed));
        }
        let (train_rows, test_rows) = rows.split_at(n_train);
        let cols = &table.columns;
        let Some(target) = &cols.target else { bail!("{}: the target column is missing", table.source) };
        if table.rows.iter().all(|r| r.target == table.rows[0].target) {
            let value = table.rows[0].target;
            let shown = table.target_levels.get(value as usize).map_or_else(|| value.to_string(), |l| format!("{l:?}"));
            bail!("{}: the target {} is constant ({shown}): nothing to learn", table.source, target.name);
        }

        // Vocabulary of each categorical column: its values in the training rows, in order of appearance.
        let vocabularies: Vec<Vec<String>> = match vocabularies {
            Some(given) => given.to_vec(),
            None => table
                .levels
                .iter()
                .enumerate()
                .map(|(k, levels)| {
                    let mut seen = vec![false; levels.len()];
                    let mut vocabulary = Vec::new();
                    for row in train_rows {
                        let level = row.categories[k] as usize;
                        if !std::mem::replace(&mut seen[level], true) {
                            vocabulary.push(levels[level].clone());
                        }
                    }
                    vocabulary
                })
                .collect(),
        };
        let mut feature_names: Vec<String> = cols.numeric.iter().map(|c| c.name.clone()).collect();
        for (c, vocabulary) in cols.categorical.iter().zip(&vocabularies) {
            feature_names.extend(vocabulary.iter().map(|v| format!("{}={v}", c.name)));
        }
        for (c, features) in cols.date.iter().zip(&table.date_features) {
            feature_names.extend(features.feature_names(&c.name));
        }
        let split = |rows: &[&Row]| Split::of_rows(table, rows, &vocabularies);
        Ok(Dataset {
            source: table.source.clone(),
            skipped: table.skipped,
            first_skipped: table.first_skipped.clone(),
            feature_names,
            target_name: target.name.clone(),
            train: split(train_rows),
            val: split(&[]),
            test: split(test_rows),
            vocabularies,
        })
    }

    /// Reads `path` and builds the dataset, split in file order.
    pub fn load(path: &Path, options: &LoadOptions) -> Result<Dataset> {
        Dataset::from_table(&Table::read(path, options)?, options.train_fraction, SplitOrder::File, 0)
    }

    /// A warning when the target of the test rows lies far from that of the training rows (their means
    /// half a training standard deviation or more apart, or their spreads twice or more apart): the MAE
    /// of the model and of the baseline are then measured on data unlike what it trained on.
    pub fn split_shift(&self) -> Option<String> {
        let (train_mean, train_std) = mean_std(self.train.y.iter().copied());
        let (test_mean, test_std) = mean_std(self.test.y.iter().copied());
        let apart = (test_mean - train_mean).abs() / train_std;
        let spread = (test_std / train_std).max(train_std / test_std);
        (apart >= 0.5 || spread >= 2.0).then(|| {
            format!(
                "warning: the test rows' {} (mean {test_mean:.4}, std {test_std:.4}) is unlike the training rows' \
                 (mean {train_mean:.4}, std {train_std:.4}), so test figures measure other data than the model learned from",
                self.target_name
            )
        })
    }

    /// Moves the last `fraction` of the training rows (rounded up, at least one) to `val`.
    pub fn hold_out(&mut self, fraction: f64) -> Result<()> {
        let n = self.train.rows;
        let n_val = ((n as f64 * fraction).ceil() as usize).max(1);
        if n_val >= n {
            bail!("--val-split {fraction} of {n} training rows leaves none to train on");
        }
        self.val = self.train.split_off(n - n_val);
        Ok(())
    }

    /// Number of features.
    pub fn features(&self) -> usize {
        self.feature_names.len()
    }
}

/// Mean and standard deviation of each feature and of the target over the training split: what the model
/// sees is (value − mean) / std.
#[derive(Clone, Debug, PartialEq)]
pub struct Stats {
    /// Mean of each feature.
    pub feature_mean: Vec<f32>,
    /// Population standard deviation; 1 for a constant feature.
    pub feature_std: Vec<f32>,
    /// Mean of the target.
    pub target_mean: f32,
    /// Population standard deviation of the target; 1 for a constant target.
    pub target_std: f32,
}

/// Refuses feature statistics (a model file's) that are not one mean and one standard deviation per
/// feature, naming the list that differs: "the statistics list 64 standard deviations for 10 features".
pub fn check_statistics_count(means: &[f32], stds: &[f32], features: usize) -> Result<()> {
    for (list, what) in [(means, "means"), (stds, "standard deviations")] {
        if list.len() != features {
            bail!("the statistics list {} {what} for {features} features", list.len());
        }
    }
    Ok(())
}

/// Mean and population std (1 when it is 0) of `values`, accumulated in f64, two passes.
fn mean_std(values: impl Iterator<Item = f32> + Clone) -> (f32, f32) {
    let (n, sum) = values.clone().fold((0usize, 0f64), |(n, s), v| (n + 1, s + v as f64));
    let mean = sum / n.max(1) as f64;
    let var = values.map(|v| (v as f64 - mean).powi(2)).sum::<f64>() / n.max(1) as f64;
    let std = var.sqrt() as f32;
    (mean as f32, if std > 0.0 { std } else { 1.0 })
}

impl Stats {
    /// The statistics of `train`.
    pub fn of(train: &Split) -> Stats {
        let f = train.features;
        let (feature_mean, feature_std) = (0..f).map(|j| mean_std(train.x.iter().skip(j).step_by(f).copied())).unzip();
        let (target_mean, target_std) = mean_std(train.y.iter().copied());
        Stats { feature_mean, feature_std, target_mean, target_std }
    }

    /// `split` with every feature and the target standardised.
    pub fn normalize(&self, split: &Split) -> Split {
        assert_eq!(split.features, self.feature_mean.len(), "split and stats have different features");
        let mut out = split.clone();
        for row in out.x.chunks_exact_mut(split.features) {
            for ((v, m), s) in row.iter_mut().zip(&self.feature_mean).zip(&self.feature_std) {
                *v = (*v - m) / s;
            }
        }
        out.y.iter_mut().for_each(|y| *y = (*y - self.target_mean) / self.target_std);
        out
    }

    /// A normalised target back in the file's units.
    pub fn target_value(&self, normalized: f32) -> f32 {
        normalized * self.target_std + self.target_mean
    }
}
