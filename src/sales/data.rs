//! Loading a table for `textnet sales`: any comma- or tab-separated file, read with the `csv` crate, turned
//! into a feature matrix and a target.
//!
//! * Delimiter: a tab when the first line has one outside quotes, else a comma (or set it).
//! * Header: the first row is a header when none of its fields is a number (or say so either way).
//! * Columns are chosen by header name or 1-based number (`ColumnSpec`): a numeric target, numeric
//!   features, categorical features (one-hot) and date features (day of year, 1–366). Without a header,
//!   `Schema::column_names` can name the columns; `Schema::sales_tsv` is the default file's schema.
//! * Features are laid out numeric columns first, then each categorical column's one-hot block, then the
//!   date columns, each in the order the schema lists them.
//! * A bad row (wrong number of fields; an empty, non-numeric, NaN or infinite value; a date that cannot
//!   be read) is an error naming `file:line:column`, or with `skip_bad_rows` is dropped and counted.
//! * The first `train_fraction` of the rows (rounded to the nearest row, at least one row on each side, in
//!   file order) trains, the rest tests. Category vocabularies come from the training rows only; a category first seen in the test
//!   rows is all zeros.
//! * `Stats` holds the training split's mean and (population) standard deviation of every feature and of
//!   the target; a constant column gets std 1.
//!
//! Dates (see `parse_date`): `YYYY-MM-DD` (optionally followed by a time, `T` or a space between),
//! `YYYY/MM/DD`, `DD.MM.YYYY`, `DD/MM/YYYY` or `MM/DD/YYYY`, `D Mon YYYY` (or `D-Mon-YYYY`) and
//! `Mon D, YYYY`, with English month names, full or abbreviated. Day and month may have one or two digits,
//! the year has four. Which of `DD/MM/YYYY` and `MM/DD/YYYY` a column uses is settled by its first date
//! with a part above 12; a later date that reads only the other way is a bad row, and a column where no
//! date settles it (and some are ambiguous, like 03/04/2024) is an error.

use anyhow::{Context, Result, anyhow, bail};
use std::collections::HashMap;
use std::fmt;
use std::path::Path;

/// A column chosen by its header name or its 1-based number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ColumnSpec {
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
    pub target: ColumnSpec,
    pub numeric: Vec<ColumnSpec>,
    pub categorical: Vec<ColumnSpec>,
    /// Each becomes one feature, its day of year.
    pub date: Vec<ColumnSpec>,
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
    /// The default file: features quantity and unit price (columns 5 and 6), category (7) one-hot, the day
    /// of year of the date (3); target total price (9).
    pub fn sales_tsv() -> Schema {
        Schema {
            target: ColumnSpec::Number(9),
            numeric: vec![ColumnSpec::Number(5), ColumnSpec::Number(6)],
            categorical: vec![ColumnSpec::Number(7)],
            date: vec![ColumnSpec::Number(3)],
            column_names: Some(SALES_COLUMNS.iter().map(|s| s.to_string()).collect()),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderMode {
    /// The first row is a header when none of its fields is a number.
    Auto,
    Present,
    Absent,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LoadOptions {
    pub schema: Schema,
    /// `b'\t'` or `b','`; None: detected from the first line.
    pub delimiter: Option<u8>,
    pub header: HeaderMode,
    /// Drop bad rows and count them, instead of failing on the first.
    pub skip_bad_rows: bool,
    /// Share of the rows, from the top of the file, that trains (the rest tests).
    pub train_fraction: f64,
}

pub const DEFAULT_TRAIN_FRACTION: f64 = 0.8;

impl LoadOptions {
    pub fn new(schema: Schema) -> LoadOptions {
        LoadOptions {
            schema,
            delimiter: None,
            header: HeaderMode::Auto,
            skip_bad_rows: false,
            train_fraction: DEFAULT_TRAIN_FRACTION,
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
    pub target: Column,
    pub numeric: Vec<Column>,
    pub categorical: Vec<Column>,
    pub date: Vec<Column>,
}

/// One good row of the table, in schema order.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// 1-based line of the file where the row starts.
    pub line: u64,
    pub numeric: Vec<f32>,
    /// Per categorical column, an index into `Table::levels` of that column.
    pub categories: Vec<u32>,
    /// Per date column, the day of year (1–366).
    pub days: Vec<f32>,
    pub target: f32,
}

/// The good rows of a file, parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// The file name as given (messages start with it).
    pub source: String,
    pub delimiter: u8,
    /// The header row's fields, when the file has one.
    pub header: Option<Vec<String>>,
    /// Fields per row (those of the first row).
    pub width: usize,
    pub columns: Columns,
    /// Per categorical column, its values in order of first appearance in the file (bad rows' included).
    pub levels: Vec<Vec<String>>,
    pub rows: Vec<Row>,
    /// Bad rows dropped (with `skip_bad_rows`).
    pub skipped: usize,
    /// The first of them, as the error it would have been.
    pub first_skipped: Option<String>,
}

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

/// How a column writes `NN/NN/YYYY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlashOrder {
    DayMonth,
    MonthDay,
}

impl SlashOrder {
    fn name(self) -> &'static str {
        match self {
            SlashOrder::DayMonth => "day/month/year",
            SlashOrder::MonthDay => "month/day/year",
        }
    }
}

/// A date as read from one field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DateValue {
    /// A date with no doubt about it.
    Date { year: u16, month: u8, day: u8 },
    /// `first/second/year`: day/month or month/day, settled per column. Both readings are valid dates when
    /// both parts are at most 12; otherwise only one is, and `order` says which.
    Slashed { first: u8, second: u8, year: u16, order: Option<SlashOrder> },
}

impl DateValue {
    /// Day of year (1–366); a `Slashed` value needs the column's order.
    pub fn day_of_year(self, order: Option<SlashOrder>) -> Option<u16> {
        match self {
            DateValue::Date { year, month, day } => Some(day_of_year(year, month, day)),
            DateValue::Slashed { first, second, year, order: own } => match own.or(order)? {
                SlashOrder::DayMonth => Some(day_of_year(year, second, first)),
                SlashOrder::MonthDay => Some(day_of_year(year, first, second)),
            },
        }
    }
}

pub const DATE_FORMATS: &str = "YYYY-MM-DD, YYYY/MM/DD, DD.MM.YYYY, DD/MM/YYYY or MM/DD/YYYY, D Mon YYYY, Mon D YYYY";

const MONTHS: [&str; 12] = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

fn is_leap(year: u16) -> bool {
    (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400)
}

fn days_in_month(year: u16, month: u8) -> u8 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Day of year (1–366) of a valid date.
pub fn day_of_year(year: u16, month: u8, day: u8) -> u16 {
    (1..month).map(|m| days_in_month(year, m) as u16).sum::<u16>() + day as u16
}

/// "no month 13" / "June 2024 has no day 31", or Ok.
fn check_date(year: u16, month: u8, day: u8) -> Result<(), String> {
    if !(1..=12).contains(&month) {
        return Err(format!("there is no month {month}"));
    }
    if day == 0 || day > days_in_month(year, month) {
        let name = MONTHS[month as usize - 1];
        let name = name[..1].to_uppercase() + &name[1..];
        return Err(format!("{name} {year} has no day {day}"));
    }
    Ok(())
}

/// A run of 1..=max_len ASCII digits making the whole of `s`.
fn digits(s: &str, max_len: usize) -> Option<u32> {
    (!s.is_empty() && s.len() <= max_len && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().unwrap())
}

fn month_named(s: &str) -> Option<u8> {
    let s = s.trim_end_matches('.').to_ascii_lowercase();
    if s == "sept" {
        return Some(9);
    }
    MONTHS.iter().position(|m| s.len() >= 3 && (*m == s || (s.len() == 3 && m.starts_with(&s)))).map(|i| i as u8 + 1)
}

/// `HH:MM[:SS[.fff]]` then `Z`, `±HH`, `±HHMM` or `±HH:MM`, or nothing.
fn valid_time(t: &str) -> bool {
    let (clock, zone) = match t.find(['Z', 'z', '+', '-']) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    let mut parts = clock.split(':');
    let (h, m) = (parts.next().and_then(|h| digits(h, 2)), parts.next().and_then(|m| digits(m, 2)));
    let ok_hm = matches!((h, m), (Some(h), Some(m)) if h <= 23 && m <= 59);
    let ok_s = match parts.next() {
        None => true,
        Some(s) => {
            let (whole, frac) = s.split_once('.').unwrap_or((s, "0"));
            matches!(digits(whole, 2), Some(s) if s <= 60) && digits(frac, 9).is_some()
        }
    };
    let ok_zone = match zone {
        "" | "Z" | "z" => true,
        z => {
            let z = z[1..].replace(':', "");
            let hhmm = if z.len() == 2 { z + "00" } else { z };
            hhmm.len() == 4 && digits(&hhmm, 4).is_some_and(|v| v / 100 <= 23 && v % 100 <= 59)
        }
    };
    ok_hm && ok_s && ok_zone && parts.next().is_none()
}

/// Reads one date in the accepted formats (module comment). The error says what is wrong with a date of
/// a known shape, or lists the formats tried.
pub fn parse_date(text: &str) -> Result<DateValue, String> {
    let s = text.trim();
    let unreadable = || format!("{text:?} is not a date in any accepted format ({DATE_FORMATS})");
    let with_year = |year: &str| -> Result<u16, String> {
        match digits(year, 4) {
            Some(y) if year.len() == 4 && y > 0 => Ok(y as u16),
            Some(_) if year.len() != 4 => Err(format!("{text:?}: the year must have four digits")),
            Some(_) => Err(format!("{text:?}: there is no year 0")),
            None => Err(unreadable()),
        }
    };
    let date = |year: u16, month: u32, day: u32| -> Result<DateValue, String> {
        let (month, day) = (month.min(99) as u8, day.min(99) as u8);
        check_date(year, month, day).map_err(|why| format!("{text:?}: {why}"))?;
        Ok(DateValue::Date { year, month, day })
    };
    let bytes = s.as_bytes();
    if bytes.len() >= 5 && bytes[..4].iter().all(u8::is_ascii_digit) && matches!(bytes[4], b'-' | b'/') {
        // YYYY-MM-DD[(T| )time] or YYYY/MM/DD
        let sep = bytes[4] as char;
        let (day_part, time) = match s.find(['T', 't', ' ']) {
            Some(i) if sep == '-' => (&s[..i], Some(s[i + 1..].trim_start())),
            _ => (s, None),
        };
        let parts: Vec<&str> = day_part.split(sep).collect();
        let (Some(m), Some(d)) = (parts.get(1).and_then(|m| digits(m, 2)), parts.get(2).and_then(|d| digits(d, 2)))
        else {
            return Err(unreadable());
        };
        if parts.len() != 3 {
            return Err(unreadable());
        }
        if let Some(t) = time
            && !valid_time(t)
        {
            return Err(format!("{text:?}: the time after the date is not HH:MM[:SS] (with an optional zone)"));
        }
        return date(with_year(parts[0])?, m, d);
    }
    for sep in ['.', '/'] {
        let parts: Vec<&str> = s.split(sep).collect();
        if parts.len() != 3 {
            continue;
        }
        let (Some(a), Some(b)) = (digits(parts[0], 2), digits(parts[1], 2)) else {
            return Err(unreadable());
        };
        let year = with_year(parts[2])?;
        if sep == '.' {
            return date(year, b, a);
        }
        let (a, b) = (a.min(99) as u8, b.min(99) as u8);
        let as_dm = check_date(year, b, a);
        let as_md = check_date(year, a, b);
        let order = match (&as_dm, &as_md) {
            (Ok(()), Ok(())) => None,
            (Ok(()), Err(_)) => Some(SlashOrder::DayMonth),
            (Err(_), Ok(())) => Some(SlashOrder::MonthDay),
            (Err(dm), Err(md)) => {
                return Err(format!("{text:?} is no date as day/month/year ({dm}) nor as month/day/year ({md})"));
            }
        };
        return Ok(DateValue::Slashed { first: a, second: b, year, order });
    }
    // D Mon YYYY, D-Mon-YYYY, Mon D YYYY, Mon D, YYYY
    let words: Vec<&str> = s.split([' ', '-', ',']).filter(|w| !w.is_empty()).collect();
    if words.len() == 3 {
        let (day, month) = match (digits(words[0], 2), month_named(words[0])) {
            (Some(d), _) => (Some(d), month_named(words[1])),
            (None, Some(m)) => (digits(words[1], 2), Some(m)),
            _ => (None, None),
        };
        if let (Some(d), Some(m)) = (day, month) {
            return date(with_year(words[2])?, m as u32, d);
        }
    }
    Err(unreadable())
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
struct Lines<'a> {
    bytes: &'a [u8],
    at: usize,
    line: u64,
}

impl<'a> Lines<'a> {
    fn new(bytes: &'a [u8]) -> Lines<'a> {
        Lines { bytes, at: 0, line: 1 }
    }

    /// The line of the record whose reported start is `offset` (offsets must not decrease).
    fn of(&mut self, offset: u64) -> u64 {
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
    dates: Vec<DateValue>,
    target: f32,
}

enum Role {
    Target,
    Numeric(usize),
    Categorical(usize),
    Date(usize),
}

impl Table {
    /// Reads and parses `path` (see the module comment).
    /// The feature rows of `rows` (rows of this table): numeric values, each categorical column one-hot over
    /// `vocabularies` (a value outside it: all zeros), then days of year.
    pub fn features(&self, rows: &[Row], vocabularies: &[Vec<String>]) -> Split {
        let slots: Vec<Vec<Option<usize>>> = self
            .levels
            .iter()
            .zip(vocabularies)
            .map(|(levels, vocabulary)| {
                let slot: HashMap<&str, usize> = vocabulary.iter().enumerate().map(|(s, v)| (v.as_str(), s)).collect();
                levels.iter().map(|l| slot.get(l.as_str()).copied()).collect()
            })
            .collect();
        let features =
            self.columns.numeric.len() + vocabularies.iter().map(Vec::len).sum::<usize>() + self.columns.date.len();
        let mut x = vec![0.0f32; rows.len() * features];
        for (row, out) in rows.iter().zip(x.chunks_exact_mut(features.max(1))) {
            let (numeric, rest) = out.split_at_mut(row.numeric.len());
            numeric.copy_from_slice(&row.numeric);
            let mut at = 0;
            for (k, vocabulary) in vocabularies.iter().enumerate() {
                if let Some(s) = slots[k][row.categories[k] as usize] {
                    rest[at + s] = 1.0;
                }
                at += vocabulary.len();
            }
            rest[at..].copy_from_slice(&row.days);
        }
        Split {
            rows: rows.len(),
            features,
            x,
            y: rows.iter().map(|r| r.target).collect(),
            lines: rows.iter().map(|r| r.line).collect(),
        }
    }

    pub fn read(path: &Path, options: &LoadOptions) -> Result<Table> {
        let bytes = crate::fsutil::read_input(path, "table")?;
        Table::parse(&crate::fsutil::shown(path), &bytes, options)
    }

    /// Parses the contents of a file called `source`.
    pub fn parse(source: &str, bytes: &[u8], options: &LoadOptions) -> Result<Table> {
        if bytes.starts_with(b"\xFF\xFE") || bytes.starts_with(b"\xFE\xFF") || bytes.iter().take(4096).any(|&b| b == 0)
        {
            bail!("{source} is not UTF-8 text (it looks like UTF-16 or binary); convert it to UTF-8 first");
        }
        let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
        if bytes.iter().all(u8::is_ascii_whitespace) {
            bail!("{source} is empty");
        }
        let delimiter = match options.delimiter {
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
        let mut reader =
            csv::ReaderBuilder::new().delimiter(delimiter).has_headers(false).flexible(true).from_reader(bytes);
        let mut record = csv::ByteRecord::new();
        let read = |reader: &mut csv::Reader<&[u8]>, record: &mut csv::ByteRecord| -> Result<bool> {
            reader.read_byte_record(record).with_context(|| format!("{source}: cannot parse as CSV"))
        };
        if !read(&mut reader, &mut record)? {
            bail!("{source} is empty");
        }
        let width = record.len();
        let has_header = match options.header {
            HeaderMode::Present => true,
            HeaderMode::Absent => false,
            HeaderMode::Auto => !record.iter().any(is_number),
        };
        let header: Option<Vec<String>> =
            has_header.then(|| record.iter().map(|f| String::from_utf8_lossy(f).trim().to_string()).collect());
        let names: Option<Vec<String>> =
            header.clone().or_else(|| options.schema.column_names.clone().filter(|names| names.len() == width));
        let columns = resolve_columns(source, &options.schema, width, names.as_deref(), has_header)?;

        // Each used column's role, in column order (a row's first bad field is the one reported).
        let mut roles: Vec<(usize, Role)> = vec![(columns.target.index, Role::Target)];
        roles.extend(columns.numeric.iter().enumerate().map(|(k, c)| (c.index, Role::Numeric(k))));
        roles.extend(columns.categorical.iter().enumerate().map(|(k, c)| (c.index, Role::Categorical(k))));
        roles.extend(columns.date.iter().enumerate().map(|(k, c)| (c.index, Role::Date(k))));
        roles.sort_by_key(|(index, _)| *index);

        let mut levels: Vec<Vec<String>> = vec![Vec::new(); columns.categorical.len()];
        let mut level_index: Vec<HashMap<String, u32>> = vec![HashMap::new(); columns.categorical.len()];
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
            match parse_row(&record, line, width, &columns, &roles, &mut levels, &mut level_index) {
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
        let (rows, date_bad) = settle_dates(source, &columns, pending, !options.skip_bad_rows && !bad.is_empty())?;
        bad.extend(date_bad);
        bad.sort_by_key(|b| b.line);
        if !options.skip_bad_rows
            && let Some(first) = bad.first()
        {
            bail!("{}", first.describe(source));
        }
        if rows.is_empty() {
            bail!("{source}: all {} rows are bad; the first: {}", bad.len(), bad[0].describe(source));
        }
        Ok(Table {
            source: source.to_string(),
            delimiter,
            header,
            width,
            columns,
            levels,
            rows,
            skipped: bad.len(),
            first_skipped: bad.first().map(|b| b.describe(source)),
        })
    }
}

/// Finds every schema column in the file.
fn resolve_columns(
    source: &str,
    schema: &Schema,
    width: usize,
    names: Option<&[String]>,
    has_header: bool,
) -> Result<Columns> {
    let resolve = |spec: &ColumnSpec, role: &str| -> Result<Column> {
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
    };
    let target = resolve(&schema.target, "target")?;
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
    let mut used: Vec<(&Column, &str)> = vec![(&columns.target, "the target")];
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
        target: 0.0,
    };
    let mut dates: Vec<Option<DateValue>> = vec![None; columns.date.len()];
    for (index, role) in roles {
        let name = match role {
            Role::Target => &columns.target.name,
            Role::Numeric(k) => &columns.numeric[*k].name,
            Role::Categorical(k) => &columns.categorical[*k].name,
            Role::Date(k) => &columns.date[*k].name,
        };
        let bad = |why: String| BadRow { line, column: index + 1, message: format!("{name}: {why}") };
        let text = std::str::from_utf8(&record[*index]).map_err(|_| bad("not valid UTF-8 text".to_string()))?;
        match role {
            Role::Target => row.target = parse_number(text).map_err(bad)?,
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
                dates[*k] = Some(parse_date(text).map_err(bad)?);
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
    pending: Vec<PendingRow>,
    stopped_early: bool,
) -> Result<(Vec<Row>, Vec<BadRow>)> {
    let mut orders: Vec<Option<(SlashOrder, u64, DateValue)>> = vec![None; columns.date.len()];
    let mut bad = Vec::new();
    let mut contradicting = vec![false; pending.len()];
    for (k, column) in columns.date.iter().enumerate() {
        let mut ambiguous = None;
        for (r, row) in pending.iter().enumerate() {
            let DateValue::Slashed { first, second, order, .. } = row.dates[k] else { continue };
            match (order, orders[k]) {
                (None, _) if first != second && ambiguous.is_none() => ambiguous = Some((row.line, row.dates[k])),
                (Some(own), None) => orders[k] = Some((own, row.line, row.dates[k])),
                (Some(own), Some((settled, at, example))) if own != settled => {
                    contradicting[r] = true;
                    bad.push(BadRow {
                        line: row.line,
                        column: column.index + 1,
                        message: format!(
                            "{}: {} reads only as {}, but this column is {} (line {at} has {})",
                            column.name,
                            slashed_text(row.dates[k]),
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
            days: p
                .dates
                .iter()
                .zip(&orders)
                .map(|(d, o)| d.day_of_year(Some(o.map_or(SlashOrder::DayMonth, |o| o.0))).unwrap_or(0) as f32)
                .collect(),
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

/// Features and targets of one split, in the units of the file (or normalised, after `Stats::normalize`).
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    pub rows: usize,
    pub features: usize,
    /// rows × features, row-major.
    pub x: Vec<f32>,
    pub y: Vec<f32>,
    /// The file line of each row.
    pub lines: Vec<u64>,
}

impl Split {
    pub fn row(&self, i: usize) -> &[f32] {
        &self.x[i * self.features..][..self.features]
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }
}

/// A table turned into features: both splits in the file's units.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// The file name as given.
    pub source: String,
    /// Bad rows dropped while reading (with `skip_bad_rows`), and the first of them as an error message.
    pub skipped: usize,
    pub first_skipped: Option<String>,
    /// Per feature: the column name, "name=value" for a one-hot entry, "name (day of year)" for a date.
    pub feature_names: Vec<String>,
    pub target_name: String,
    /// Per categorical column, its vocabulary (the values of the training rows, in order of appearance):
    /// entry v is one-hot feature v of that column's block.
    pub vocabularies: Vec<Vec<String>>,
    pub train: Split,
    pub test: Split,
}

impl Dataset {
    /// Splits `table` in file order, the first `train_fraction` (rounded to the nearest row, but leaving at
    /// least one row on each side) training.
    pub fn from_table(table: &Table, train_fraction: f64) -> Result<Dataset> {
        if !(train_fraction.is_finite() && train_fraction > 0.0 && train_fraction < 1.0) {
            bail!("the training share of the rows must be between 0 and 1 (exclusive), got {train_fraction}");
        }
        let n = table.rows.len();
        if n < 2 {
            bail!("{}: only 1 usable row, too few to split: at least one row must train and one test", table.source);
        }
        let n_train = ((n as f64 * train_fraction).round() as usize).clamp(1, n - 1);
        let (train_rows, test_rows) = table.rows.split_at(n_train);
        let cols = &table.columns;

        // Vocabulary of each categorical column: its values in the training rows, in order of appearance.
        let vocabularies: Vec<Vec<String>> = table
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
            .collect();
        let mut feature_names: Vec<String> = cols.numeric.iter().map(|c| c.name.clone()).collect();
        for (c, vocabulary) in cols.categorical.iter().zip(&vocabularies) {
            feature_names.extend(vocabulary.iter().map(|v| format!("{}={v}", c.name)));
        }
        feature_names.extend(cols.date.iter().map(|c| format!("{} (day of year)", c.name)));
        let split = |rows: &[Row]| table.features(rows, &vocabularies);
        Ok(Dataset {
            source: table.source.clone(),
            skipped: table.skipped,
            first_skipped: table.first_skipped.clone(),
            feature_names,
            target_name: cols.target.name.clone(),
            train: split(train_rows),
            test: split(test_rows),
            vocabularies,
        })
    }

    /// Reads `path` and builds the dataset.
    pub fn load(path: &Path, options: &LoadOptions) -> Result<Dataset> {
        Dataset::from_table(&Table::read(path, options)?, options.train_fraction)
    }

    pub fn features(&self) -> usize {
        self.feature_names.len()
    }
}

/// Mean and standard deviation of each feature and of the target over the training split: what the model
/// sees is (value − mean) / std.
#[derive(Clone, Debug, PartialEq)]
pub struct Stats {
    pub feature_mean: Vec<f32>,
    /// Population standard deviation; 1 for a constant feature.
    pub feature_std: Vec<f32>,
    pub target_mean: f32,
    pub target_std: f32,
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
