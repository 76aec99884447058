//! The schema of a table given only its target: every other column's role inferred from its values,
//! unless `--numeric`, `--categorical`, `--date` or `--ignore` names it.
//!
//! In this order: a column without a name, or named `id`, is an identifier and ignored; one whose every
//! value reads as a date (`dates::parse_date`, so `20141013` too) is a date; one whose every value is a
//! number (quoted or not) is numeric, unless its values are consecutive whole numbers, each once, in any
//! order (a row number: an identifier); a column of text whose every value differs is an identifier; any
//! other is categorical. Empty fields are passed over here (reading the table reports them).

use super::dates::parse_date_time;
use super::table::{self, ColumnSpec, Schema};
use anyhow::{Result, bail};
use std::collections::HashSet;

/// The columns flags give a role, overriding the inference.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// Columns `--numeric` names.
    pub numeric: Vec<ColumnSpec>,
    /// Columns `--categorical` names.
    pub categorical: Vec<ColumnSpec>,
    /// Columns `--date` names.
    pub date: Vec<ColumnSpec>,
    /// Columns `--ignore` names.
    pub ignore: Vec<ColumnSpec>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
/// What a column is used as.
pub enum Role {
    /// The value to predict.
    Target,
    /// A number feature.
    Numeric,
    /// A categorical feature, one-hot encoded.
    Categorical,
    /// A date, turned into calendar features.
    Date,
    /// Not used.
    Ignored,
}

impl Role {
    /// The role in words, e.g. "categorical".
    pub fn name(self) -> &'static str {
        match self {
            Role::Target => "target",
            Role::Numeric => "numeric",
            Role::Categorical => "categorical",
            Role::Date => "date",
            Role::Ignored => "ignored",
        }
    }
}

/// What became of one column, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// Its header name, or "column N".
    pub name: String,
    /// What the column is used as.
    pub role: Role,
    /// Why, in words for the printed schema.
    pub reason: String,
}

impl Choice {
    /// "  price: target (--target)".
    pub fn line(&self) -> String {
        format!("  {}: {} ({})", self.name, self.role.name(), self.reason)
    }
}

/// What the values of one column are.
struct Profile {
    values: usize,
    all_numbers: bool,
    all_integers: bool,
    min: f64,
    max: f64,
    all_dates: bool,
    any_time: bool,
    distinct: HashSet<Vec<u8>>,
    repeats: bool,
}

impl Profile {
    fn new() -> Profile {
        Profile {
            values: 0,
            all_numbers: true,
            all_integers: true,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            all_dates: true,
            any_time: false,
            distinct: HashSet::new(),
            repeats: false,
        }
    }

    fn add(&mut self, field: &[u8]) {
        let Ok(text) = std::str::from_utf8(field) else {
            (self.all_numbers, self.all_dates) = (false, false);
            return;
        };
        let text = text.trim();
        if text.is_empty() {
            return;
        }
        self.values += 1;
        if self.all_numbers {
            match text.parse::<f64>() {
                Ok(v) if v.is_finite() => {
                    self.all_integers &= v.fract() == 0.0;
                    (self.min, self.max) = (self.min.min(v), self.max.max(v));
                }
                _ => self.all_numbers = false,
            }
        }
        if self.all_dates {
            match parse_date_time(text) {
                Ok((_, minute)) => self.any_time |= minute.is_some_and(|m| m != 0),
                Err(_) => self.all_dates = false,
            }
        }
        if !self.distinct.insert(text.as_bytes().to_vec()) {
            self.repeats = true;
        }
    }

    /// The role the values suggest, and why.
    fn infer(&self) -> (Role, String) {
        if self.values == 0 {
            return (Role::Ignored, "no values".into());
        }
        if self.all_dates {
            let times = if self.any_time { "some with a time of day" } else { "none with a time of day" };
            return (Role::Date, format!("every value reads as a date, {times}"));
        }
        if self.all_numbers {
            let row_count = self.all_integers && !self.repeats && self.max - self.min == (self.values - 1) as f64;
            if row_count && self.values > 2 {
                return (Role::Ignored, "an identifier: consecutive whole numbers, each once".into());
            }
            return (Role::Numeric, "every value is a number".into());
        }
        if !self.repeats && self.values > 1 {
            return (Role::Ignored, "an identifier: every value is different".into());
        }
        (Role::Categorical, format!("{} distinct values", self.distinct.len()))
    }
}

/// The schema of the table `bytes` (called `source`) predicting `target`: every column's role, by
/// `overrides` or inferred from its values (module comment), with the reasons in column order.
pub fn infer(source: &str, bytes: &[u8], target: &ColumnSpec, overrides: &Overrides) -> Result<(Schema, Vec<Choice>)> {
    let mut reader = table::open_csv(source, bytes, None)?.reader;
    let mut record = csv::ByteRecord::new();
    let read =
        |reader: &mut csv::Reader<&[u8]>, record: &mut csv::ByteRecord| table::read_record(source, reader, record);
    if !read(&mut reader, &mut record)? {
        bail!("{source} is empty");
    }
    let width = record.len();
    let has_header = table::looks_like_header(&record);
    let names: Option<Vec<String>> =
        has_header.then(|| record.iter().map(|f| String::from_utf8_lossy(f).trim().to_string()).collect());
    let mut profiles: Vec<Profile> = (0..width).map(|_| Profile::new()).collect();
    let mut add = |record: &csv::ByteRecord| {
        // A row of another width is reported when the table is read.
        if record.len() == width {
            profiles.iter_mut().zip(record.iter()).for_each(|(p, field)| p.add(field));
        }
    };
    if !has_header {
        add(&record);
    }
    while read(&mut reader, &mut record)? {
        add(&record);
    }

    let resolve = |spec: &ColumnSpec, role: &str| {
        table::resolve_column(source, spec, role, width, names.as_deref(), has_header).map(|c| c.index)
    };
    let target_index = resolve(target, "target")?;
    let mut given: Vec<Option<(Role, &str)>> = vec![None; width];
    given[target_index] = Some((Role::Target, "--target"));
    for (specs, role, flag) in [
        (&overrides.numeric, Role::Numeric, "--numeric"),
        (&overrides.categorical, Role::Categorical, "--categorical"),
        (&overrides.date, Role::Date, "--date"),
        (&overrides.ignore, Role::Ignored, "--ignore"),
    ] {
        for spec in specs {
            let index = resolve(spec, &flag[2..])?;
            if let Some((_, other)) = given[index] {
                bail!("{source}: column {} ({spec}) is given to both {other} and {flag}", index + 1);
            }
            given[index] = Some((role, flag));
        }
    }

    let header_name = |i: usize| names.as_ref().map_or("", |n| n[i].as_str());
    let unique = |i: usize| names.as_ref().is_some_and(|n| n.iter().filter(|m| **m == n[i]).count() == 1);
    let mut schema = Schema {
        target: target.clone(),
        numeric: vec![],
        categorical: vec![],
        date: vec![],
        date_features: None,
        column_names: None,
    };
    let mut choices = Vec::with_capacity(width);
    for (i, profile) in profiles.iter().enumerate() {
        let (role, reason) = match given[i] {
            Some((role, flag)) => (role, flag.to_string()),
            None if has_header && header_name(i).is_empty() => {
                (Role::Ignored, "an identifier: the column has no name".into())
            }
            None if header_name(i).eq_ignore_ascii_case("id") => (Role::Ignored, "an identifier: named id".into()),
            None => profile.infer(),
        };
        let spec = if !header_name(i).is_empty() && unique(i) {
            ColumnSpec::Name(header_name(i).to_string())
        } else {
            ColumnSpec::Number(i + 1)
        };
        match role {
            Role::Target => schema.target = spec,
            Role::Numeric => schema.numeric.push(spec),
            Role::Categorical => schema.categorical.push(spec),
            Role::Date => schema.date.push(spec),
            Role::Ignored => {}
        }
        let name = if header_name(i).is_empty() { format!("column {}", i + 1) } else { header_name(i).to_string() };
        choices.push(Choice { name, role, reason });
    }
    Ok((schema, choices))
}
