//! Reading a table for `textnet sales`: any comma- or tab-separated file, read with the `csv` crate, into
//! the rows of the columns its schema names.
//!
//! * Delimiter: a tab when the first line has one outside quotes, else a comma (or set it).
//! * Header: the first row is a header when none of its fields is a number (or say so either way).
//! * Columns are chosen by header name or 1-based number (`ColumnSpec`): a numeric target, numeric
//!   features, categorical features (one-hot) and date features (`dates::DateFeatures`). Without a
//!   header, `Schema::column_names` can name the columns; `Schema::sales_tsv` is the default file's schema.
//! * Rows to predict (`LoadOptions::target_optional`) may leave the target empty, or leave its column out
//!   (one column fewer than `LoadOptions::width`).
//! * A bad row (wrong number of fields; an empty, non-numeric, NaN or infinite value; a date that cannot
//!   be read) is an error naming `file:line:column`, or with `skip_bad_rows` is dropped and counted.
//! * A date column's day/month order is settled by its first date with a part above 12; a later date that
//!   reads only the other way is a bad row, and a column where no date settles it (and some are
//!   ambiguous, like 03/04/2024) is an error.

use super::dates::{DateFeatures, DateValue, SlashOrder, parse_date_time};
use anyhow::{Context, Result, anyhow, bail};
use std::collections::HashMap;
use std::fmt;
use std::path::Path;

/// A column chosen by its header name or its 1-based number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ColumnSpec {
    /// Its header name.
    Name(String),
    /// 1-based.
    Number(usize),
}

impl ColumnSpec {
    /// All digits: a column number (from 1); anything else: a header name.
    pub fn parse(s: &str) -> Result<ColumnSpec> {
        let s = s.trim();
        if s.is_empty() {
            bail!("a column must be given as a header name or a number from 1, got an empty string");
        }
        if s.bytes().all(|b| b.is_ascii_digit()) {
            return match s.parse::<usize>() {
                Ok(0) => bail!("column numbers start at 1, got 0"),
                Ok(n) => Ok(ColumnSpec::Number(n)),
                Err(_) => bail!("column number {s} is too large"),
            };
        }
        Ok(ColumnSpec::Name(s.to_string()))
    }
}

impl std::str::FromStr for ColumnSpec {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<ColumnSpec> {
        ColumnSpec::parse(s)
    }
}

impl fmt::Display for ColumnSpec {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            ColumnSpec::Name(name) => write!(f, "{name:?}"),
            ColumnSpec::Number(n) => write!(f, "column {n}"),
        }
    }
}

/// Which columns are the target and the features.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schema {
    /// The column to predict.
    pub target: ColumnSpec,
    /// Number columns.
    pub numeric: Vec<ColumnSpec>,
    /// Categorical columns, one-hot encoded.
    pub categorical: Vec<ColumnSpec>,
    /// Date columns.
    pub date: Vec<ColumnSpec>,
    /// The features of each date column; None: `DateFeatures::Calendar`, with the time of day when some
    /// value of the column has a time other than midnight.
    pub date_features: Option<Vec<DateFeatures>>,
    /// Names for the columns of a file without a header (in messages and feature names, and for
    /// `ColumnSpec::Name`); used only when the file has exactly this many columns.
    pub column_names: Option<Vec<String>>,
}

/// The columns of the default `sales.tsv`, in file order.
pub const SALES_COLUMNS: [&str; 10] = [
    "product name",
    "product code",
    "date",
    "timestamp",
    "quantity",
    "unit price",
    "category",
    "user",
    "total price",
    "id",
];

impl Schema {
    /// The schema of the same table with the target's column left out: the columns after it, given by
    /// number, move one to the left (the target keeps its spec but is not looked for).
    pub fn without_target(&self) -> Schema {
        let target = match &self.target {
            ColumnSpec::Number(n) => Some(n - 1),
            ColumnSpec::Name(name) => self.column_names.as_ref().and_then(|names| names.iter().position(|c| c == name)),
        };
        let Some(target) = target else { return self.clone() };
        let shift = |specs: &[ColumnSpec]| -> Vec<ColumnSpec> {
            specs
                .iter()
                .map(|spec| match spec {
                    ColumnSpec::Number(n) if *n > target + 1 => ColumnSpec::Number(n - 1),
                    other => other.clone(),
                })
                .collect()
        };
        let mut column_names = self.column_names.clone();
        if let Some(names) = column_names.as_mut().filter(|names| target < names.len()) {
            names.remove(target);
        }
        Schema {
            target: self.target.clone(),
            numeric: shift(&self.numeric),
            categorical: shift(&self.categorical),
            date: shift(&self.date),
            date_features: self.date_features.clone(),
            column_names,
        }
    }

    /// The default file: features quantity and unit price (columns 5 and 6), category (7) one-hot, the day
    /// of year of the date (3); target total price (9).
    pub fn sales_tsv() -> Schema {
        Schema {
            target: ColumnSpec::Number(9),
            numeric: vec![ColumnSpec::Number(5), ColumnSpec::Number(6)],
            categorical: vec![ColumnSpec::Number(7)],
            date: vec![ColumnSpec::Number(3)],
            date_features: Some(vec![DateFeatures::DayOfYear]),
            column_names: Some(SALES_COLUMNS.iter().map(|s| s.to_string()).collect()),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
/// Whether the table's first row is a header.
pub enum HeaderMode {
    /// The first row is a header when none of its fields is a number.
    Auto,
    /// The first row is a header.
    Present,
    /// Every row is data.
    Absent,
}

#[derive(Clone, Debug, PartialEq)]
/// How to read a table.
pub struct LoadOptions {
    /// Which columns to read and as what.
    pub schema: Schema,
    /// `b'\t'` or `b','` (a model's, which names it in the error of a file of the other); None: detected
    /// from the first line.
    pub delimiter: Option<u8>,
    /// Whether the first row is a header.
    pub header: HeaderMode,
    /// Drop bad rows and count them, instead of failing on the first.
    pub skip_bad_rows: bool,
    /// Share of the rows, from the top of the file, that trains (the rest tests).
    pub train_fraction: f64,
    /// The number of columns a row must have (None: as many as the first row).
    pub width: Option<usize>,
    /// Rows to predict: the target may be empty, or its column left out (then `width` counts it).
    pub target_optional: bool,
    /// The target is a class label (any text, numbers included) rather than a number: each row's
    /// `Row::target` is the index of its label in `Table::target_levels`.
    pub target_labels: bool,
}

/// Fraction of the rows that train when `--split` is not given, 0 to 1.
pub const DEFAULT_TRAIN_FRACTION: f64 = 0.8;

impl LoadOptions {
    /// Options for `schema` with the defaults: delimiter and header detected, bad rows fatal.
    pub fn new(schema: Schema) -> LoadOptions {
        LoadOptions {
            schema,
            delimiter: None,
            header: HeaderMode::Auto,
            skip_bad_rows: false,
            train_fraction: DEFAULT_TRAIN_FRACTION,
            width: None,
            target_optional: false,
            target_labels: false,
        }
    }
}

/// A column of the file that the schema uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    /// 0-based.
    pub index: usize,
    /// Its header name, its `Schema::column_names` entry, or "column N".
    pub name: String,
}

/// The schema's columns, found in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Columns {
    /// None only for rows to predict that leave the target's column out.
    pub target: Option<Column>,
    /// The number columns, in schema order.
    pub numeric: Vec<Column>,
    /// The categorical columns, in schema order.
    pub categorical: Vec<Column>,
    /// The date columns, in schema order.
    pub date: Vec<Column>,
}

/// One good row of the table, in schema order.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// 1-based line of the file where the row starts.
    pub line: u64,
    /// The value of each number column.
    pub numeric: Vec<f32>,
    /// Per categorical column, an index into `Table::levels` of that column.
    pub categories: Vec<u32>,
    /// The date columns' features, each column's `Table::date_features` in turn.
    pub dates: Vec<f32>,
    /// NaN where rows to predict have no target; with `LoadOptions::target_labels`, the index of the
    /// row's label in `Table::target_levels`.
    pub target: f32,
}

/// The good rows of a file, parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// The file name as given (messages start with it).
    pub source: String,
    /// The field separator, `b'\t'` or `b','`.
    pub delimiter: u8,
    /// The header row's fields, when the file has one.
    pub header: Option<Vec<String>>,
    /// Fields per row (those of the first row).
    pub width: usize,
    /// The schema's columns, found in the file.
    pub columns: Columns,
    /// Per categorical column, its values in order of first appearance in the file (bad rows' included).
    pub levels: Vec<Vec<String>>,
    /// With `LoadOptions::target_labels`: the target's labels in order of first appearance (else empty).
    pub target_levels: Vec<String>,
    /// The features of each date column.
    pub date_features: Vec<DateFeatures>,
    /// The rows read.
    pub rows: Vec<Row>,
    /// Bad rows dropped (with `skip_bad_rows`).
    pub skipped: usize,
    /// The first of them, as the error it would have been.
    pub first_skipped: Option<String>,
}

/// The bad row that stopped reading a table (without `LoadOptions::skip_bad_rows`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadRowError {
    /// The 1-based column of the bad field.
    pub column: usize,
    /// `file:line:column: message`.
    pub message: String,
}

impl fmt::Display for BadRowError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for BadRowError {}

/// A bad field or row: `file:line:column: message` once the file is known.
#[derive(Clone, Debug, PartialEq, Eq)]
struct BadRow {
    line: u64,
    /// 1-based.
    column: usize,
    message: String,
}

impl BadRow {
    fn describe(&self, source: &str) -> String {
        format!("{source}:{}:{}: {}", self.line, self.column, self.message)
    }
}

/// Parses a numeric field: no empty, NaN, infinite or out-of-f32-range values.
fn parse_number(text: &str) -> Result<f32, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty field, expected a number".to_string());
    }
    match s.parse::<f64>() {
        Err(_) => Err(format!("{s:?} is not a number")),
        Ok(v) if v.is_nan() => Err(format!("{s:?} is not a number (NaN)")),
        Ok(v) if v.is_infinite() => Err(format!("{s:?} is infinite")),
        Ok(v) if !(v as f32).is_finite() => Err(format!("{s:?} is beyond the range of 32-bit floats")),
        Ok(v) => Ok(v as f32),
    }
}

fn is_number(field: &[u8]) -> bool {
    std::str::from_utf8(field).is_ok_and(|s| s.trim().parse::<f64>().is_ok_and(f64::is_finite))
}

/// The delimiter of a file: a tab if its first non-blank line has one outside quotes, else a comma if it
/// has one.
fn detect_delimiter(bytes: &[u8]) -> Option<u8> {
    let (mut tabs, mut commas, mut quoted) = (0, 0, false);
    let start = bytes.iter().position(|b| !matches!(b, b'\r' | b'\n')).unwrap_or(bytes.len());
    for &b in &bytes[start..] {
        match b {
            b'"' => quoted = !quoted,
            b'\n' | b'\r' if !quoted => break,
            b'\t' if !quoted => tabs += 1,
            b',' if !quoted => commas += 1,
            _ => {}
        }
    }
    if tabs > 0 {
        Some(b'\t')
    } else if commas > 0 {
        Some(b',')
    } else {
        None
    }
}

/// The line of a quoted field that runs to the end of the file, read as the CSV reader does: a quote
/// opens a field only at its start, `""` inside it is a quote, and a quote inside an unquoted field
/// (`27" screen`) is text.
fn unclosed_quote(bytes: &[u8], delimiter: u8) -> Option<usize> {
    enum State {
        FieldStart,
        Unquoted,
        Quoted,
        QuoteInQuoted,
    }
    let (mut state, mut line, mut opened) = (State::FieldStart, 1, 1);
    for &b in bytes {
        let ends_field = b == delimiter || b == b'\n' || b == b'\r';
        state = match state {
            State::FieldStart if b == b'"' => {
                opened = line;
                State::Quoted
            }
            State::Quoted if b == b'"' => State::QuoteInQuoted,
            State::Quoted => State::Quoted,
            State::QuoteInQuoted if b == b'"' => State::Quoted,
            _ if ends_field => State::FieldStart,
            _ => State::Unquoted,
        };
        line += usize::from(b == b'\n');
    }
    matches!(state, State::Quoted).then_some(opened)
}

/// What a row is missing or has too much of, or None when it has `width` fields.
fn width_problem(line: u64, len: usize, width: usize) -> Option<BadRow> {
    use std::cmp::Ordering::*;
    match len.cmp(&width) {
        Equal => None,
        Less => Some(BadRow {
            line,
            column: len + 1,
            message: format!("{len} fields, expected {width} (as in the first row): column {} is missing", len + 1),
        }),
        Greater => Some(BadRow {
            line,
            column: width + 1,
            message: format!("{len} fields, expected {width} (as in the first row)"),
        }),
    }
}

/// Line numbers of record starts. The csv crate's own count is off after CRLF line ends and blank lines,
/// and its byte offset of a record can point at the line ends before it; this skips those and counts
/// `\n`, `\r\n` and a lone `\r` as one line end each.
pub(super) struct Lines<'a> {
    bytes: &'a [u8],
    at: usize,
    line: u64,
}

impl<'a> Lines<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Lines<'a> {
        Lines { bytes, at: 0, line: 1 }
    }

    /// The line of the record whose reported start is `offset` (offsets must not decrease).
    pub(super) fn of(&mut self, offset: u64) -> u64 {
        let mut start = (offset as usize).min(self.bytes.len());
        while start < self.bytes.len() && matches!(self.bytes[start], b'\r' | b'\n') {
            start += 1;
        }
        while self.at < start {
            let b = self.bytes[self.at];
            if b == b'\n' || (b == b'\r' && self.bytes.get(self.at + 1) != Some(&b'\n')) {
                self.line += 1;
            }
            self.at += 1;
        }
        self.line
    }
}

/// A row before its slashed dates are settled.
struct PendingRow {
    line: u64,
    numeric: Vec<f32>,
    categories: Vec<u32>,
    /// Each date and its minute of the day, when it has a time.
    dates: Vec<(DateValue, Option<u16>)>,
    target: f32,
}

enum Role {
    /// `optional`: rows to predict may leave it empty.
    Target {
        optional: bool,
        labels: bool,
    },
    Numeric(usize),
    Categorical(usize),
    Date(usize),
}

impl Table {
    /// Reads and parses `path` (see the module comment).
    pub fn read(path: &Path, options: &LoadOptions) -> Result<Table> {
        let bytes = crate::io::fsutil::read_input(path, "table")?;
        Table::parse(&crate::io::fsutil::shown(path), &bytes, options)
    }

    /// Parses the contents of a file called `source`. A file that does not read with the delimiter
    /// `options` give (a model's) and whose first line is separated by the other one is refused as such.
    pub fn parse(source: &str, bytes: &[u8], options: &LoadOptions) -> Result<Table> {
        Table::parse_rows(source, bytes, options).map_err(|e| {
            let Some(expected) = options.delimiter else { return e };
            match other_delimiter(bytes, expected) {
                Some(theirs) => anyhow!(
                    "{source}: the model reads {} rows but this file is {theirs}; write it as the model's training \
                     table was",
                    delimiter_name(expected)
                ),
                None => e,
            }
        })
    }

    fn parse_rows(source: &str, bytes: &[u8], options: &LoadOptions) -> Result<Table> {
        let OpenCsv { bytes, delimiter, mut reader } = open_csv(source, bytes, options.delimiter)?;
        let mut record = csv::ByteRecord::new();
        let read = |reader: &mut csv::Reader<&[u8]>, record: &mut csv::ByteRecord| read_record(source, reader, record);
        if !read(&mut reader, &mut record)? {
            bail!("{source} is empty");
        }
        let width = record.len();
        let has_header = match options.header {
            HeaderMode::Present => true,
            HeaderMode::Absent => false,
            HeaderMode::Auto => looks_like_header(&record),
        };
        let header: Option<Vec<String>> =
            has_header.then(|| record.iter().map(|f| String::from_utf8_lossy(f).trim().to_string()).collect());
        let target_left_out = match options.width {
            Some(full) if options.target_optional && width + 1 == full => true,
            Some(full) if width != full => bail!(
                "{source} has {width} columns, but the model reads {full}{}",
                if options.target_optional {
                    format!(" (or {} without the target {})", full - 1, options.schema.target)
                } else {
                    String::new()
                }
            ),
            _ => false,
        };
        let schema = if target_left_out { options.schema.without_target() } else { options.schema.clone() };
        let names: Option<Vec<String>> =
            header.clone().or_else(|| schema.column_names.clone().filter(|names| names.len() == width));
        let columns = resolve_columns(source, &schema, width, names.as_deref(), has_header, target_left_out)?;

        // Each used column's role, in column order (a row's first bad field is the one reported).
        let mut roles: Vec<(usize, Role)> = columns
            .target
            .iter()
            .map(|c| (c.index, Role::Target { optional: options.target_optional, labels: options.target_labels }))
            .collect();
        roles.extend(columns.numeric.iter().enumerate().map(|(k, c)| (c.index, Role::Numeric(k))));
        roles.extend(columns.categorical.iter().enumerate().map(|(k, c)| (c.index, Role::Categorical(k))));
        roles.extend(columns.date.iter().enumerate().map(|(k, c)| (c.index, Role::Date(k))));
        roles.sort_by_key(|(index, _)| *index);

        let mut levels: Vec<Vec<String>> = vec![Vec::new(); columns.categorical.len()];
        let mut level_index: Vec<HashMap<String, u32>> = vec![HashMap::new(); columns.categorical.len()];
        // The target's labels, after the categorical columns' (with `target_labels`).
        levels.push(Vec::new());
        level_index.push(HashMap::new());
        let mut pending = Vec::new();
        let mut bad: Vec<BadRow> = Vec::new();
        let mut seen_rows = 0usize;
        let mut first = !has_header;
        let mut lines = Lines::new(bytes);
        loop {
            if !first && !read(&mut reader, &mut record)? {
                break;
            }
            first = false;
            let line = lines.of(record.position().map_or(0, |p| p.byte()));
            seen_rows += 1;
            let parsed = parse_row(&record, line, width, &columns, &roles, &mut levels, &mut level_index);
            match parsed {
                Ok(row) => pending.push(row),
                Err(e) => {
                    bad.push(e);
                    if !options.skip_bad_rows {
                        break;
                    }
                }
            }
        }
        if seen_rows == 0 {
            bail!("{source} has a header row but no data rows");
        }
        let date_features = match &options.schema.date_features {
            Some(features) if features.len() == columns.date.len() => features.clone(),
            Some(features) => {
                bail!("the schema gives features for {} date columns but names {}", features.len(), columns.date.len())
            }
            None => (0..columns.date.len())
                .map(|k| DateFeatures::Calendar {
                    time_of_day: pending.iter().any(|r: &PendingRow| r.dates[k].1.is_some_and(|minute| minute != 0)),
                })
                .collect(),
        };
        let stopped_early = !options.skip_bad_rows && !bad.is_empty();
        let (rows, date_bad) = settle_dates(source, &columns, &date_features, pending, stopped_early)?;
        bad.extend(date_bad);
        bad.sort_by_key(|b| b.line);
        if !options.skip_bad_rows
            && let Some(first) = bad.first()
        {
            return Err(BadRowError { column: first.column, message: first.describe(source) }.into());
        }
        if rows.is_empty() {
            bail!("{source}: all {} rows are bad; the first: {}", bad.len(), bad[0].describe(source));
        }
        let target_levels = levels.pop().unwrap_or_default();
        Ok(Table {
            target_levels,
            source: source.to_string(),
            delimiter,
            header,
            width,
            columns,
            levels,
            date_features,
            rows,
            skipped: bad.len(),
            first_skipped: bad.first().map(|b| b.describe(source)),
        })
    }
}

/// "tab-separated" or "comma-separated".
fn delimiter_name(delimiter: u8) -> &'static str {
    if delimiter == b'\t' { "tab-separated" } else { "comma-separated" }
}

/// How a table's first line is separated, when by the other of tab and comma than `expected` alone.
fn other_delimiter(bytes: &[u8], expected: u8) -> Option<&'static str> {
    let first = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
    let other = if expected == b'\t' { b',' } else { b'\t' };
    (first.contains(&other) && !first.contains(&expected)).then(|| delimiter_name(other))
}

/// A file's bytes checked as UTF-8 text (a byte-order mark dropped), its delimiter (`delimiter`, else
/// detected), and a CSV reader over its records.
pub(super) fn open_csv<'a>(source: &str, bytes: &'a [u8], delimiter: Option<u8>) -> Result<OpenCsv<'a>> {
    // UTF-16 has a NUL in every other byte of ASCII text; a stray NUL in a text file is its field's error.
    let head = &bytes[..bytes.len().min(4096)];
    let nuls = head.iter().filter(|&&b| b == 0).count();
    if bytes.starts_with(b"\xFF\xFE") || bytes.starts_with(b"\xFE\xFF") || nuls * 100 > head.len() {
        bail!("{source} is not UTF-8 text (it looks like UTF-16 or binary); convert it to UTF-8 first");
    }
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    if bytes.iter().all(u8::is_ascii_whitespace) {
        bail!("{source} is empty");
    }
    let delimiter = match delimiter {
        Some(d) => d,
        None => detect_delimiter(bytes).ok_or_else(|| {
            let first_row = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
            let semicolons = if first_row.contains(&b';') {
                " (semicolon-separated tables are not read: convert it to commas, or tabs, with '.' as the decimal mark)"
            } else {
                ""
            };
            anyhow!("{source}: the first row has neither a tab nor a comma, so it is no table of several columns{semicolons}")
        })?,
    };
    if let Some(line) = unclosed_quote(bytes, delimiter) {
        bail!("{source}:{line}: a quoted field (\"…) opens here and is never closed");
    }
    let reader = || csv::ReaderBuilder::new().delimiter(delimiter).has_headers(false).flexible(true).from_reader(bytes);
    if bytes.contains(&0) {
        refuse_nul(source, bytes, reader())?;
    }
    Ok(OpenCsv { bytes, delimiter, reader: reader() })
}

/// Refuses the first field of `bytes` that holds a NUL byte, as `file:line:column`.
fn refuse_nul(source: &str, bytes: &[u8], mut reader: csv::Reader<&[u8]>) -> Result<()> {
    let (mut record, mut lines) = (csv::ByteRecord::new(), Lines::new(bytes));
    while read_record(source, &mut reader, &mut record)? {
        if let Some(column) = record.iter().position(|field| field.contains(&0)) {
            let line = lines.of(record.position().map_or(0, |p| p.byte()));
            bail!("{source}:{line}:{}: a NUL byte in the field", column + 1);
        }
    }
    Ok(())
}

/// What `open_csv` opened.
pub(super) struct OpenCsv<'a> {
    /// The file's bytes without a byte-order mark.
    pub bytes: &'a [u8],
    pub delimiter: u8,
    pub reader: csv::Reader<&'a [u8]>,
}

/// Whether a first row is a header: none of its fields is a number.
pub(super) fn looks_like_header(record: &csv::ByteRecord) -> bool {
    !record.iter().any(is_number)
}

/// Finds the column `spec` (the `role` column, in messages) among `width` columns named `names`.
pub(super) fn resolve_column(
    source: &str,
    spec: &ColumnSpec,
    role: &str,
    width: usize,
    names: Option<&[String]>,
    has_header: bool,
) -> Result<Column> {
    let index = match spec {
        ColumnSpec::Number(n) => {
            if *n == 0 || *n > width {
                bail!("{source}: the {role} column is number {n}, but the rows have {width} columns");
            }
            n - 1
        }
        ColumnSpec::Name(name) => {
            let Some(names) = names else {
                bail!(
                    "{source}: the {role} column is given by the name {name:?}, but the file has no header \
                     row (its first row holds numbers); give its number instead"
                );
            };
            let exact: Vec<usize> = (0..names.len()).filter(|&i| names[i] == *name).collect();
            let matches = if exact.is_empty() {
                (0..names.len()).filter(|&i| names[i].eq_ignore_ascii_case(name)).collect()
            } else {
                exact
            };
            match matches[..] {
                [i] => i,
                [] => bail!(
                    "{source}: no column is named {name:?} (the {}: {})",
                    if has_header { "header has" } else { "columns are" },
                    names.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", ")
                ),
                _ => bail!(
                    "{source}: {} columns are named {name:?} (numbers {}); give the {role} column by number",
                    matches.len(),
                    matches.iter().map(|i| (i + 1).to_string()).collect::<Vec<_>>().join(", ")
                ),
            }
        }
    };
    let name = match names {
        Some(names) if !names[index].is_empty() => names[index].clone(),
        _ => format!("column {}", index + 1),
    };
    Ok(Column { index, name })
}

/// Finds every schema column in the file.
fn resolve_columns(
    source: &str,
    schema: &Schema,
    width: usize,
    names: Option<&[String]>,
    has_header: bool,
    target_left_out: bool,
) -> Result<Columns> {
    let resolve = |spec: &ColumnSpec, role: &str| resolve_column(source, spec, role, width, names, has_header);
    let target = if target_left_out { None } else { Some(resolve(&schema.target, "target")?) };
    let many = |specs: &[ColumnSpec], role: &str| specs.iter().map(|s| resolve(s, role)).collect::<Result<Vec<_>>>();
    let columns = Columns {
        target,
        numeric: many(&schema.numeric, "numeric")?,
        categorical: many(&schema.categorical, "categorical")?,
        date: many(&schema.date, "date")?,
    };
    if columns.numeric.is_empty() && columns.categorical.is_empty() && columns.date.is_empty() {
        bail!("{source}: no feature columns are chosen (numeric, categorical or date)");
    }
    let mut used: Vec<(&Column, &str)> = columns.target.iter().map(|c| (c, "the target")).collect();
    used.extend(columns.numeric.iter().map(|c| (c, "a numeric feature")));
    used.extend(columns.categorical.iter().map(|c| (c, "a categorical feature")));
    used.extend(columns.date.iter().map(|c| (c, "a date feature")));
    for (k, (a, role_a)) in used.iter().enumerate() {
        if let Some((_, role_b)) = used[..k].iter().find(|(b, _)| b.index == a.index) {
            bail!("{source}: column {} ({}) is chosen twice, as {role_b} and as {role_a}", a.index + 1, a.name);
        }
    }
    Ok(columns)
}

fn parse_row(
    record: &csv::ByteRecord,
    line: u64,
    width: usize,
    columns: &Columns,
    roles: &[(usize, Role)],
    levels: &mut [Vec<String>],
    level_index: &mut [HashMap<String, u32>],
) -> Result<PendingRow, BadRow> {
    if let Some(bad) = width_problem(line, record.len(), width) {
        return Err(bad);
    }
    let mut row = PendingRow {
        line,
        numeric: vec![0.0; columns.numeric.len()],
        categories: vec![0; columns.categorical.len()],
        dates: Vec::with_capacity(columns.date.len()),
        target: f32::NAN,
    };
    let mut dates: Vec<Option<(DateValue, Option<u16>)>> = vec![None; columns.date.len()];
    for (index, role) in roles {
        let name = match role {
            Role::Target { .. } => &columns.target.as_ref().expect("a target role has its column").name,
            Role::Numeric(k) => &columns.numeric[*k].name,
            Role::Categorical(k) => &columns.categorical[*k].name,
            Role::Date(k) => &columns.date[*k].name,
        };
        let bad = |why: String| BadRow { line, column: index + 1, message: format!("{name}: {why}") };
        let text = std::str::from_utf8(&record[*index]).map_err(|_| bad("not valid UTF-8 text".to_string()))?;
        match role {
            Role::Target { optional: true, .. } if text.trim().is_empty() => row.target = f32::NAN,
            Role::Target { labels: true, .. } => {
                let value = text.trim();
                if value.is_empty() {
                    return Err(bad("empty field, expected a class label".to_string()));
                }
                let k = levels.len() - 1;
                let next = levels[k].len() as u32;
                let id = *level_index[k].entry(value.to_string()).or_insert(next);
                if id == next {
                    levels[k].push(value.to_string());
                }
                row.target = id as f32;
            }
            Role::Target { .. } => row.target = parse_number(text).map_err(bad)?,
            Role::Numeric(k) => row.numeric[*k] = parse_number(text).map_err(bad)?,
            Role::Categorical(k) => {
                let value = text.trim();
                if value.is_empty() {
                    return Err(bad("empty field, expected a category".to_string()));
                }
                let next = levels[*k].len() as u32;
                let id = *level_index[*k].entry(value.to_string()).or_insert(next);
                if id == next {
                    levels[*k].push(value.to_string());
                }
                row.categories[*k] = id;
            }
            Role::Date(k) => {
                if text.trim().is_empty() {
                    return Err(bad("empty field, expected a date".to_string()));
                }
                dates[*k] = Some(parse_date_time(text).map_err(bad)?);
            }
        }
    }
    row.dates = dates.into_iter().map(|d| d.expect("every date column has a role")).collect();
    Ok(row)
}

/// Settles each date column's day/month order and turns the rows' dates into days of the year. Rows whose
/// slashed date reads only the other way than the column's are returned as bad. `stopped_early`: reading
/// stopped at a bad row, so an unsettled column is no error of its own (that row's error is reported).
fn settle_dates(
    source: &str,
    columns: &Columns,
    date_features: &[DateFeatures],
    pending: Vec<PendingRow>,
    stopped_early: bool,
) -> Result<(Vec<Row>, Vec<BadRow>)> {
    let mut orders: Vec<Option<(SlashOrder, u64, DateValue)>> = vec![None; columns.date.len()];
    let mut bad = Vec::new();
    let mut contradicting = vec![false; pending.len()];
    for (k, column) in columns.date.iter().enumerate() {
        let mut ambiguous = None;
        for (r, row) in pending.iter().enumerate() {
            let (date, _) = row.dates[k];
            let DateValue::Slashed { first, second, order, .. } = date else { continue };
            match (order, orders[k]) {
                (None, _) if first != second && ambiguous.is_none() => ambiguous = Some((row.line, date)),
                (Some(own), None) => orders[k] = Some((own, row.line, date)),
                (Some(own), Some((settled, at, example))) if own != settled => {
                    contradicting[r] = true;
                    bad.push(BadRow {
                        line: row.line,
                        column: column.index + 1,
                        message: format!(
                            "{}: {} reads only as {}, but this column is {} (line {at} has {})",
                            column.name,
                            slashed_text(date),
                            own.name(),
                            settled.name(),
                            slashed_text(example)
                        ),
                    });
                }
                _ => {}
            }
        }
        if orders[k].is_none()
            && !stopped_early
            && let Some((line, example)) = ambiguous
        {
            bail!(
                "{source}: column {} ({}): dates such as {} (line {line}) could be day/month/year or month/day/year, \
                 and no date in the column settles which; write them as YYYY-MM-DD",
                column.index + 1,
                column.name,
                slashed_text(example)
            );
        }
    }
    let rows = pending
        .into_iter()
        .zip(contradicting)
        .filter(|(_, c)| !c)
        .map(|(p, _)| Row {
            line: p.line,
            numeric: p.numeric,
            categories: p.categories,
            // An unsettled order (possible only when reading stopped early, or first == second) reads day/month.
            dates: {
                let mut features = Vec::new();
                for ((&(date, minute), order), encoding) in p.dates.iter().zip(&orders).zip(date_features) {
                    let ymd = date.ymd(Some(order.map_or(SlashOrder::DayMonth, |o| o.0)));
                    encoding.encode(ymd.expect("an order is given"), minute.unwrap_or(0), &mut features);
                }
                features
            },
            target: p.target,
        })
        .collect();
    Ok((rows, bad))
}

fn slashed_text(d: DateValue) -> String {
    match d {
        DateValue::Slashed { first, second, year, .. } => format!("{first:02}/{second:02}/{year}"),
        DateValue::Date { year, month, day } => format!("{year}-{month:02}-{day:02}"),
    }
}

/// Reads the next record of the table `source` into `record`: false at its end, an error naming
/// `source` where the bytes are not CSV.
pub fn read_record(source: &str, reader: &mut csv::Reader<&[u8]>, record: &mut csv::ByteRecord) -> Result<bool> {
    reader.read_byte_record(record).with_context(|| format!("{source}: cannot parse as CSV"))
}
