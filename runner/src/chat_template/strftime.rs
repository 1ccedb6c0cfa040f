//! `strftime_now`'s formatting: glibc's strftime, in UTC, with no C library.
use std::fmt::Write as _;
// ---------------------------------------------------------------------------------------
// strftime

const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
pub(super) fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

/// The date of a day count since 1970-01-01.
pub(super) fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z.rem_euclid(146097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

/// Python's `datetime.strftime` (glibc, C locale) for a naive UTC time:
/// `%Z` and `%z` are empty, as for `datetime.now()`; `%-d` drops padding.
pub(super) fn strftime(secs: i64, micros: u32, format: &str) -> String {
    let days = secs.div_euclid(86400);
    let sod = secs.rem_euclid(86400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (sod / 3600, sod / 60 % 60, sod % 60);
    let wday = (days + 4).rem_euclid(7) as usize;
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.peek() == Some(&'-');
        if unpadded {
            chars.next();
        }
        let num = |out: &mut String, n: i64, width: usize| {
            if unpadded {
                let _ = write!(out, "{n}");
            } else {
                let _ = write!(out, "{n:0width$}");
            }
        };
        match chars.next() {
            Some('a') => out.push_str(&DAYS[wday][..3]),
            Some('A') => out.push_str(DAYS[wday]),
            Some('b') | Some('h') => out.push_str(&MONTHS[month as usize - 1][..3]),
            Some('B') => out.push_str(MONTHS[month as usize - 1]),
            Some('c') => out.push_str(&strftime(secs, micros, "%a %b %e %H:%M:%S %Y")),
            Some('C') => num(&mut out, year.div_euclid(100), 2),
            Some('d') => num(&mut out, day as i64, 2),
            Some('D') | Some('x') => out.push_str(&strftime(secs, micros, "%m/%d/%y")),
            Some('e') => {
                let _ = if unpadded {
                    write!(out, "{day}")
                } else {
                    write!(out, "{day:2}")
                };
            }
            Some('f') => num(&mut out, micros as i64, 6),
            Some('F') => out.push_str(&strftime(secs, micros, "%Y-%m-%d")),
            Some('H') => num(&mut out, hour, 2),
            Some('I') => num(&mut out, hour12, 2),
            Some('j') => num(&mut out, yday, 3),
            Some('k') => {
                let _ = write!(out, "{hour:2}");
            }
            Some('l') => {
                let _ = write!(out, "{hour12:2}");
            }
            Some('m') => num(&mut out, month as i64, 2),
            Some('M') => num(&mut out, minute, 2),
            Some('n') => out.push('\n'),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('R') => out.push_str(&strftime(secs, micros, "%H:%M")),
            Some('s') => {
                let _ = write!(out, "{secs}");
            }
            Some('S') => num(&mut out, second, 2),
            Some('t') => out.push('\t'),
            Some('T') | Some('X') => out.push_str(&strftime(secs, micros, "%H:%M:%S")),
            Some('u') => num(&mut out, if wday == 0 { 7 } else { wday as i64 }, 1),
            Some('w') => num(&mut out, wday as i64, 1),
            Some('y') => num(&mut out, year.rem_euclid(100), 2),
            Some('Y') => {
                let _ = write!(out, "{year}");
            }
            Some('z') | Some('Z') => {}
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}
