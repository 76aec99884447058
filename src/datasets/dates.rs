//! Dates as `textnet sales` reads them from a table's date columns (see `parse_date`): ISO 8601 dates and
//! date-times, extended or basic, with or without a zone (`2014-10-13`, `2014-10-13T13:08:00+02:00`,
//! `2014-10-13 13:08`, `20141013T000000`, `20141013`; read by the `jiff` crate), `YYYY/MM/DD`,
//! `DD.MM.YYYY`, `DD/MM/YYYY` or `MM/DD/YYYY`, `D Mon YYYY` (or `D-Mon-YYYY`) and `Mon D, YYYY`, with
//! English month names, full or abbreviated. Day and month may have one or two digits, the year has four. Which of `DD/MM/YYYY` and
//! `MM/DD/YYYY` a column uses is settled by the table (`table::settle_dates`) from its first date with a
//! part above 12.
//!
//! Each date column gives features by its `DateFeatures`: the year as a number; the day of year and the
//! day of week as points on a circle (sin, cos), so that 31 December lies beside 1 January and Sunday
//! beside Monday; and, in a column with times of day, the time of day on a circle too. Standardisation
//! (`data::Stats`) then scales each like any other feature. Models written before these features read
//! the day of year alone, as a number (`DateFeatures::DayOfYear`).

/// How a column writes `NN/NN/YYYY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlashOrder {
    /// `DD/MM/YYYY`.
    DayMonth,
    /// `MM/DD/YYYY`.
    MonthDay,
}

impl SlashOrder {
    /// The order in words, "day/month/year" or "month/day/year".
    pub fn name(self) -> &'static str {
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
    Date {
        /// The year, e.g. 2024.
        year: u16,
        /// The month, 1–12.
        month: u8,
        /// The day of the month, 1–31.
        day: u8,
    },
    /// `first/second/year`: day/month or month/day, settled per column. Both readings are valid dates when
    /// both parts are at most 12; otherwise only one is, and `order` says which.
    Slashed {
        /// The number before the first slash.
        first: u8,
        /// The number between the slashes.
        second: u8,
        /// The year.
        year: u16,
        /// The only valid reading, when just one of the two is a valid date.
        order: Option<SlashOrder>,
    },
}

impl DateValue {
    /// Year, month and day; a `Slashed` value needs the column's order.
    pub fn ymd(self, order: Option<SlashOrder>) -> Option<(u16, u8, u8)> {
        match self {
            DateValue::Date { year, month, day } => Some((year, month, day)),
            DateValue::Slashed { first, second, year, order: own } => match own.or(order)? {
                SlashOrder::DayMonth => Some((year, second, first)),
                SlashOrder::MonthDay => Some((year, first, second)),
            },
        }
    }

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

/// The date formats a date column may use, in words for messages.
pub const DATE_FORMATS: &str = "ISO 8601 such as YYYY-MM-DD[THH:MM[:SS]] or YYYYMMDD[THHMMSS], YYYY/MM/DD, DD.MM.YYYY, DD/MM/YYYY or MM/DD/YYYY, D Mon YYYY, Mon D YYYY";

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

/// The features of one date column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DateFeatures {
    /// The day of year, 1–366, as one number (the first sales.tsv schema, and older models).
    DayOfYear,
    /// Year; day of year and day of week as sin/cos; with `time_of_day`, the time of day as sin/cos.
    Calendar {
        /// Whether the time of day is among the features.
        time_of_day: bool,
    },
}

impl DateFeatures {
    /// What a model file calls it.
    pub fn name(self) -> &'static str {
        match self {
            DateFeatures::DayOfYear => "day_of_year",
            DateFeatures::Calendar { time_of_day: false } => "calendar",
            DateFeatures::Calendar { time_of_day: true } => "calendar_time",
        }
    }

    /// The features of that name (as model files store them), if any.
    pub fn from_name(name: &str) -> Option<DateFeatures> {
        [
            DateFeatures::DayOfYear,
            DateFeatures::Calendar { time_of_day: false },
            DateFeatures::Calendar { time_of_day: true },
        ]
        .into_iter()
        .find(|f| f.name() == name)
    }

    /// The names of the features of column `column`, in order.
    pub fn feature_names(self, column: &str) -> Vec<String> {
        const CALENDAR: [&str; 7] = [
            "year",
            "day of year sin",
            "day of year cos",
            "day of week sin",
            "day of week cos",
            "hour sin",
            "hour cos",
        ];
        let parts = match self {
            DateFeatures::DayOfYear => &["day of year"][..],
            DateFeatures::Calendar { .. } => &CALENDAR[..self.count()],
        };
        parts.iter().map(|p| format!("{column} ({p})")).collect()
    }

    /// Number of features a date column gives.
    pub fn count(self) -> usize {
        match self {
            DateFeatures::DayOfYear => 1,
            DateFeatures::Calendar { time_of_day: false } => 5,
            DateFeatures::Calendar { time_of_day: true } => 7,
        }
    }

    /// Appends the features of the valid date `year-month-day` at `minute` of the day (0 without a time).
    pub fn encode(self, (year, month, day): (u16, u8, u8), minute: u16, out: &mut Vec<f32>) {
        let doy = day_of_year(year, month, day);
        if self == DateFeatures::DayOfYear {
            out.push(doy as f32);
            return;
        }
        let circle = |at: f64, period: f64| {
            let angle = std::f64::consts::TAU * at / period;
            [angle.sin() as f32, angle.cos() as f32]
        };
        let year_days = if is_leap(year) { 366.0 } else { 365.0 };
        out.push(year as f32);
        out.extend(circle((doy - 1) as f64, year_days));
        out.extend(circle(weekday(year, month, day) as f64, 7.0));
        if self == (DateFeatures::Calendar { time_of_day: true }) {
            out.extend(circle(minute as f64, 24.0 * 60.0));
        }
    }
}

/// Day of week of a valid date, Monday 0 to Sunday 6.
pub fn weekday(year: u16, month: u8, day: u8) -> u8 {
    jiff::civil::date(year as i16, month as i8, day as i8).weekday().to_monday_zero_offset() as u8
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

/// Year, month, day, and the minute of the day when a time is written.
type IsoDate = (u16, u32, u32, Option<u16>);

/// ISO 8601's calendar date, alone or with a time of day and a zone, in the extended form
/// (`2014-10-13`, `2014-10-13T13:08:00+02:00`, `2014-10-13 13:08`) or the basic one (`20141013`,
/// `20141013T000000Z`), read by jiff: the year, month and day as written (a zone does not move the date).
/// None when `s` has neither shape; an error says what is wrong with a date that has one. The last
/// number is the minute of the day, when a time is written.
fn iso_date(text: &str, s: &str) -> Option<Result<IsoDate, String>> {
    let b = s.as_bytes();
    let year_digits = b.len() >= 5 && b[..4].iter().all(u8::is_ascii_digit);
    let extended = year_digits && b[4] == b'-';
    let basic = b.len() >= 8 && b[..8].iter().all(u8::is_ascii_digit) && matches!(b.get(8), None | Some(b'T' | b't'));
    if !extended && !basic {
        return None;
    }
    let civil = s.strip_suffix(['Z', 'z']).unwrap_or(s);
    let minute = |t: &jiff::civil::DateTime| {
        let time_at = if extended { s.find(['T', 't', ' ']) } else { s.find(['T', 't']) };
        time_at.map(|_| t.hour() as u16 * 60 + t.minute() as u16)
    };
    if let Ok(t) = civil.parse::<jiff::civil::DateTime>() {
        return Some(Ok((t.year() as u16, t.month() as u32, t.day() as u32, minute(&t))));
    }
    // Say what is wrong: the date itself, or what follows it.
    let (y, m, d) = if extended {
        let mut parts = s[..s.find(['T', 't', ' ']).unwrap_or(s.len())].split('-');
        (parts.next(), parts.next(), parts.next().filter(|_| parts.next().is_none()))
    } else {
        (Some(&s[..4]), Some(&s[4..6]), Some(&s[6..8]))
    };
    let unreadable = format!("{text:?} is not a date in any accepted format ({DATE_FORMATS})");
    let (Some(y), Some(m), Some(d)) =
        (y.and_then(|y| digits(y, 4)), m.and_then(|m| digits(m, 2)), d.and_then(|d| digits(d, 2)))
    else {
        return Some(Err(unreadable));
    };
    if y == 0 {
        return Some(Err(format!("{text:?}: there is no year 0")));
    }
    if let Err(why) = check_date(y as u16, m.min(99) as u8, d.min(99) as u8) {
        return Some(Err(format!("{text:?}: {why}")));
    }
    // A valid date that jiff did not take has one-digit parts (`2024-3-5`): read it with them padded.
    let time_at = if extended { s.find(['T', 't', ' ']).unwrap_or(s.len()) } else { 8 };
    let time = &civil[time_at.min(civil.len())..];
    match format!("{y:04}-{m:02}-{d:02}{time}").parse::<jiff::civil::DateTime>() {
        Ok(t) => Some(Ok((y as u16, m, d, minute(&t)))),
        Err(_) => Some(Err(format!("{text:?}: the time after the date is not HH:MM[:SS] (with an optional zone)"))),
    }
}

/// Whether `text` is written as a date in an accepted form but with a two-digit year (`3/14/24`,
/// `14.03.24`, `Mar 14, 24`), which is not read: with the year's century written it would be.
pub fn short_year_date(text: &str) -> bool {
    let s = text.trim();
    let before_year = s.trim_end_matches(|c: char| c.is_ascii_digit());
    let year = &s[before_year.len()..];
    year.len() == 2 && !before_year.is_empty() && parse_date(&format!("{before_year}20{year}")).is_ok()
}

/// Reads one date in the accepted formats (module comment). The error says what is wrong with a date of
/// a known shape, or lists the formats tried.
pub fn parse_date(text: &str) -> Result<DateValue, String> {
    parse_date_time(text).map(|(date, _)| date)
}

/// `parse_date`, and the minute of the day when the value has a time of day (ISO 8601 forms only).
pub fn parse_date_time(text: &str) -> Result<(DateValue, Option<u16>), String> {
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
    if let Some(iso) = iso_date(text, s) {
        return iso.and_then(|(year, month, day, minute)| Ok((date(year, month, day)?, minute)));
    }
    let bytes = s.as_bytes();
    if bytes.len() >= 5 && bytes[..4].iter().all(u8::is_ascii_digit) && bytes[4] == b'/' {
        // YYYY/MM/DD
        let parts: Vec<&str> = s.split('/').collect();
        let (Some(m), Some(d)) = (parts.get(1).and_then(|m| digits(m, 2)), parts.get(2).and_then(|d| digits(d, 2)))
        else {
            return Err(unreadable());
        };
        if parts.len() != 3 {
            return Err(unreadable());
        }
        return date(with_year(parts[0])?, m, d).map(|d| (d, None));
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
            return date(year, b, a).map(|d| (d, None));
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
        return Ok((DateValue::Slashed { first: a, second: b, year, order }, None));
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
            return date(with_year(words[2])?, m as u32, d).map(|d| (d, None));
        }
    }
    Err(unreadable())
}
