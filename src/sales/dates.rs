//! Dates as `textnet sales` reads them from a table's date columns (see `parse_date`): `YYYY-MM-DD`
//! (optionally followed by a time, `T` or a space between), `YYYY/MM/DD`, `DD.MM.YYYY`, `DD/MM/YYYY` or
//! `MM/DD/YYYY`, `D Mon YYYY` (or `D-Mon-YYYY`) and `Mon D, YYYY`, with English month names, full or
//! abbreviated. Day and month may have one or two digits, the year has four. Which of `DD/MM/YYYY` and
//! `MM/DD/YYYY` a column uses is settled by the table (`table::settle_dates`) from its first date with a
//! part above 12.

/// How a column writes `NN/NN/YYYY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlashOrder {
    DayMonth,
    MonthDay,
}

impl SlashOrder {
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
