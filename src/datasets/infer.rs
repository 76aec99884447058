//! The schema of a table given only its target: every other column's role inferred from its values,
//! unless `--numeric`, `--categorical`, `--date` or `--ignore` names it.
//!
//! In this order: a column without a name, or named `id`, is an identifier and ignored; one whose every
//! value reads as a date (`dates::parse_date`, so `20141013` too) is a date; one whose every value is a
//! number (quoted or not; NaN, infinities and values beyond 32-bit floats are numbers written wrong) is
//! numeric, unless its values are consecutive whole numbers, each once, in any order (a row number: an
//! identifier); one whose values are all dates, or all numbers, but for at most 1 in 20 is a date, or
//! numeric, and those few are bad rows when the table is read (a typo, NaN or impossible date does not
//! change a column's role: it stops the run at FILE:LINE:COLUMN, or `--skip-bad-rows` drops it); a column
//! of text whose every value differs is an identifier; any other is categorical. Empty fields are passed
//! over here (reading the table reports them). The target's values say whether it is a number or a
//! label by the same rule.

use super::dates::{parse_date_time, short_year_date};
use super::table::{self, BadRowError, ColumnSpec, Lines, OpenCsv, Schema};
use anyhow::{Result, anyhow, bail};
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

/// How a column's role was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChosenBy {
    /// A flag named it (`--target`, `--numeric`, …).
    Flag,
    /// Its header: no name, or named `id`.
    Name,
    /// Every value.
    Values,
    /// All but a few values (at most 1 in `FEW`), not this first of the others: they are bad rows when
    /// the table is read.
    MostValues(Cell),
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
    /// How the role was chosen.
    pub by: ChosenBy,
}

impl Choice {
    /// "  price: target (--target)".
    pub fn line(&self) -> String {
        let other = match &self.by {
            ChosenBy::MostValues(first) => format!("; the first other: {}", first.describe()),
            _ => String::new(),
        };
        format!("  {}: {} ({}{other})", self.name, self.role.name(), self.reason)
    }
}

/// A value of a column, and the line of its row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cell {
    /// 1-based line of the file where the row starts.
    pub line: u64,
    /// The value as the file writes it (trimmed).
    pub text: String,
}

impl Cell {
    /// "line 152, \"x\"" (a long value abridged).
    fn describe(&self) -> String {
        format!("line {}, {:?}", self.line, crate::harness::console::abridged(&self.text))
    }
}

/// A column whose values are all of one kind but at most 1 in `FEW` takes that kind's role, and the
/// others are bad values: one typo, NaN or impossible date does not change what the column is.
const FEW: usize = 20;

/// Whether `exceptions` of `values` are few enough (`FEW`).
fn few(exceptions: usize, values: usize) -> bool {
    exceptions * FEW <= values
}

/// The schema inferred for a table, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inferred {
    /// The columns' roles.
    pub schema: Schema,
    /// What became of each column and why, in column order.
    pub choices: Vec<Choice>,
    /// What the target's values are.
    pub target: TargetValues,
}

/// What a target's values are, by the rule for a numeric column (module comment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetValues {
    /// Numbers.
    Numbers,
    /// Numbers but for a few, not this first of them.
    MostlyNumbers(Cell),
    /// Labels, this the first value that is not a number.
    Labels(Cell),
}

impl Inferred {
    /// `error`, from reading the table with this schema, with what to do about its bad row: drop such
    /// rows with --skip-bad-rows, or, for a column whose role most but not all of its values gave it,
    /// give its role by flag.
    pub fn explain(&self, error: anyhow::Error) -> anyhow::Error {
        let Some(bad) = error.downcast_ref::<BadRowError>() else { return error };
        match self.choices.get(bad.column - 1) {
            Some(c) if matches!(c.by, ChosenBy::MostValues(_)) => anyhow!(
                "{}; {} is a {} column because {}: use --skip-bad-rows to drop such rows, or give it another role \
                 with --categorical or --ignore",
                bad.message,
                c.name,
                c.role.name(),
                c.reason
            ),
            _ => anyhow!("{} (use --skip-bad-rows to drop such rows)", bad.message),
        }
    }

    /// A warning for each column left out because of its values.
    pub fn warnings(&self, source: &str) -> Vec<String> {
        let dropped = self.choices.iter().filter(|c| c.role == Role::Ignored && c.by == ChosenBy::Values);
        dropped
            .map(|c| {
                format!(
                    "warning: {source}: column {} is left out ({}); give its role with --numeric, --categorical or \
                     --date to use it",
                    c.name, c.reason
                )
            })
            .collect()
    }
}

/// What the values of one column are.
struct Profile {
    values: usize,
    /// Values that read as numbers: NaN, infinities and values beyond 32-bit floats too (numbers written
    /// wrong, which reading the table reports).
    numbers: usize,
    first_non_number: Option<Cell>,
    all_integers: bool,
    min: f64,
    max: f64,
    dates: usize,
    first_non_date: Option<Cell>,
    any_time: bool,
    /// Values written as dates with a two-digit year (`3/14/24`), a form not read; counted while every
    /// value is a date or one of these.
    short_year_dates: usize,
    distinct: HashSet<Vec<u8>>,
    repeats: bool,
}

impl Profile {
    fn new() -> Profile {
        Profile {
            values: 0,
            numbers: 0,
            first_non_number: None,
            all_integers: true,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            dates: 0,
            first_non_date: None,
            any_time: false,
            short_year_dates: 0,
            distinct: HashSet::new(),
            repeats: false,
        }
    }

    fn add(&mut self, field: &[u8], line: u64) {
        let utf8 = std::str::from_utf8(field).ok();
        let lossy = String::from_utf8_lossy(field);
        let text = lossy.trim();
        if text.is_empty() {
            return;
        }
        self.values += 1;
        let cell = || Cell { line, text: text.to_string() };
        match utf8.and_then(|t| t.trim().parse::<f64>().ok()) {
            Some(v) => {
                self.numbers += 1;
                self.all_integers &= v.fract() == 0.0;
                (self.min, self.max) = (self.min.min(v), self.max.max(v));
            }
            None => _ = self.first_non_number.get_or_insert_with(cell),
        }
        // Dates are read on while the column may be one: its first `FEW` values, then when any was a date
        // or every value so far was a date or a two-digit-year one.
        let seen = self.values - 1;
        if seen < FEW || self.dates > 0 || self.short_year_dates == seen {
            match utf8.map(parse_date_time) {
                Some(Ok((_, minute))) => {
                    self.dates += 1;
                    self.any_time |= minute.is_some_and(|m| m != 0);
                }
                _ => {
                    self.first_non_date.get_or_insert_with(cell);
                    self.short_year_dates += usize::from(short_year_date(text));
                }
            }
        }
        if !self.distinct.insert(text.as_bytes().to_vec()) {
            self.repeats = true;
        }
    }

    /// The role the values suggest, why, and whether all of them or most suggest it.
    fn infer(&self) -> (Role, String, ChosenBy) {
        let (values, non_dates, non_numbers) = (self.values, self.values - self.dates, self.values - self.numbers);
        let times = if self.any_time { "some with a time of day" } else { "none with a time of day" };
        if values == 0 {
            return (Role::Ignored, "no values".into(), ChosenBy::Values);
        }
        if non_dates == 0 {
            return (Role::Date, format!("every value reads as a date, {times}"), ChosenBy::Values);
        }
        if non_numbers == 0 {
            let row_count = self.all_integers && !self.repeats && self.max - self.min == (values - 1) as f64;
            if row_count && values > 2 {
                let reason = "an identifier: consecutive whole numbers, each once".into();
                return (Role::Ignored, reason, ChosenBy::Values);
            }
            return (Role::Numeric, "every value is a number".into(), ChosenBy::Values);
        }
        if let Some(first) = self.first_non_date.as_ref().filter(|_| few(non_dates, values)) {
            let but = format!("every value but {non_dates} reads as a date, {times}");
            return (Role::Date, but, ChosenBy::MostValues(first.clone()));
        }
        if let Some(first) = self.first_non_number.as_ref().filter(|_| few(non_numbers, values)) {
            let but = format!("every value but {non_numbers} is a number");
            return (Role::Numeric, but, ChosenBy::MostValues(first.clone()));
        }
        let short_years = if self.short_year_dates > 0 && self.dates + self.short_year_dates == values {
            "; they look like dates with two-digit years, which are not read: write the years with 4 digits to read \
             them as dates"
        } else {
            ""
        };
        if !self.repeats && values > 1 {
            return (Role::Ignored, format!("an identifier: every value is different{short_years}"), ChosenBy::Values);
        }
        (Role::Categorical, format!("{} distinct values{short_years}", self.distinct.len()), ChosenBy::Values)
    }

    /// Whether the values are numbers: all, or all but a few.
    fn numbers(&self) -> bool {
        few(self.values - self.numbers, self.values)
    }
}

/// The schema of the table `bytes` (called `source`) predicting `target`: every column's role, by
/// `overrides` or inferred from its values (module comment), with the reasons in column order.
pub fn infer(source: &str, bytes: &[u8], target: &ColumnSpec, overrides: &Overrides) -> Result<Inferred> {
    let OpenCsv { bytes, mut reader, .. } = table::open_csv(source, bytes, None)?;
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
    let mut lines = Lines::new(bytes);
    let mut add = |record: &csv::ByteRecord| {
        let line = lines.of(record.position().map_or(0, |p| p.byte()));
        // A row of another width is reported when the table is read.
        if record.len() == width {
            profiles.iter_mut().zip(record.iter()).for_each(|(p, field)| p.add(field, line));
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
        let (role, reason, by) = match given[i] {
            Some((role, flag)) => (role, flag.to_string(), ChosenBy::Flag),
            None if has_header && header_name(i).is_empty() => {
                (Role::Ignored, "an identifier: the column has no name".into(), ChosenBy::Name)
            }
            None if header_name(i).eq_ignore_ascii_case("id") => {
                (Role::Ignored, "an identifier: named id".into(), ChosenBy::Name)
            }
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
        choices.push(Choice { name, role, reason, by });
    }
    let target_profile = &profiles[target_index];
    let target = match target_profile.first_non_number.clone() {
        None => TargetValues::Numbers,
        Some(first) if target_profile.numbers() => TargetValues::MostlyNumbers(first),
        Some(first) => TargetValues::Labels(first),
    };
    Ok(Inferred { schema, choices, target })
}
