//! Loading tables for `textnet sales`: delimiters, headers, column choice, quoting, bad rows (each named
//! by file, line and column), dates, one-hot features, the split and the normalisation statistics.

use textnet::datasets::features::{Dataset, SplitOrder, Stats};
use textnet::sales::dates::{DateFeatures, DateValue, SlashOrder, day_of_year, parse_date, parse_date_time};
use textnet::sales::table::{ColumnSpec, HeaderMode, LoadOptions, Schema, Table};

fn spec(s: &str) -> ColumnSpec {
    ColumnSpec::parse(s).unwrap()
}

/// target, numeric, categorical, date columns, each given as names or numbers; each date column gives
/// its day of year.
fn schema(target: &str, numeric: &[&str], categorical: &[&str], date: &[&str]) -> Schema {
    Schema {
        target: spec(target),
        numeric: numeric.iter().map(|s| spec(s)).collect(),
        categorical: categorical.iter().map(|s| spec(s)).collect(),
        date: date.iter().map(|s| spec(s)).collect(),
        date_features: Some(vec![DateFeatures::DayOfYear; date.len()]),
        column_names: None,
    }
}

fn load(text: &str, options: &LoadOptions) -> anyhow::Result<Table> {
    Table::parse("t.csv", text.as_bytes(), options)
}

fn error(text: &str, options: &LoadOptions) -> String {
    let e = load(text, options).expect_err("this table must not load");
    let message = format!("{e:#}");
    assert!(!message.contains('\n'), "one line: {message}");
    message
}

fn skipping(mut options: LoadOptions) -> LoadOptions {
    options.skip_bad_rows = true;
    options
}

/// Three sales rows in the default schema's column order.
fn sales_rows(delimiter: char) -> String {
    let rows = [
        ["Mug", "SKU-1", "2024-01-02", "1704153600", "2", "4.50", "Home", "U1", "9.00", "1"],
        ["Pen", "SKU-2", "2024-02-01", "1706745600", "10", "1.25", "Office", "U2", "12.50", "2"],
        ["Tent", "SKU-3", "2024-12-31", "1735603200", "1", "99.99", "Outdoor", "U3", "99.99", "3"],
    ];
    rows.iter().map(|r| r.join(&delimiter.to_string()) + "\n").collect()
}

#[test]
fn the_default_schema_reads_a_sales_tsv() {
    let t = load(&sales_rows('\t'), &LoadOptions::new(Schema::sales_tsv())).unwrap();
    assert_eq!(t.delimiter, b'\t');
    assert_eq!(t.header, None);
    assert_eq!(t.width, 10);
    assert_eq!(t.columns.target.as_ref().unwrap().name, "total price");
    assert_eq!(t.columns.numeric.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["quantity", "unit price"]);
    assert_eq!(t.levels, [vec!["Home", "Office", "Outdoor"]]);
    assert_eq!(t.rows.len(), 3);
    let r = &t.rows[1];
    assert_eq!(
        (r.line, r.numeric.clone(), r.categories.clone(), r.dates.clone(), r.target),
        (2, vec![10.0, 1.25], vec![1], vec![32.0], 12.5)
    );
    assert_eq!(t.rows[2].dates, [366.0]);
}

#[test]
fn commas_and_tabs_are_detected() {
    let tsv = load(&sales_rows('\t'), &LoadOptions::new(Schema::sales_tsv())).unwrap();
    let csv = load(&sales_rows(','), &LoadOptions::new(Schema::sales_tsv())).unwrap();
    assert_eq!(csv.delimiter, b',');
    assert_eq!(csv.rows, tsv.rows);
    // A comma inside a tab-separated field does not make the file comma-separated.
    let t = load("a, b\tx\n1,5\t2\n3\t4\n", &LoadOptions::new(schema("2", &[], &["1"], &[]))).unwrap();
    assert_eq!(t.delimiter, b'\t');
    assert_eq!(t.header.as_deref(), Some(&["a, b".to_string(), "x".to_string()][..]));
    // A comma inside quotes does not count, a tab does the rest.
    let t = load("\"a,b\"\tx\ny\t1\nz\t2\n", &LoadOptions::new(schema("x", &[], &["1"], &[]))).unwrap();
    assert_eq!((t.delimiter, t.rows.len()), (b'\t', 2));
    assert!(
        error("just one column\n1\n", &LoadOptions::new(schema("1", &["1"], &[], &[])))
            .contains("t.csv: the first row has neither a tab nor a comma")
    );
}

#[test]
fn headers_are_detected_and_columns_found_by_name_or_number() {
    let text =
        "Qty,Price,Region,When,Total\n2,4.5,north,2024-01-02,9\n3,1,south,2024-01-03,3\n1,2,north,2024-03-01,2\n";
    let by_name = load(text, &LoadOptions::new(schema("Total", &["Qty", "price"], &["Region"], &["When"]))).unwrap();
    let by_number = load(text, &LoadOptions::new(schema("5", &["1", "2"], &["3"], &["4"]))).unwrap();
    assert_eq!(by_name.rows, by_number.rows);
    assert_eq!(by_name.header.as_ref().unwrap().len(), 5);
    assert_eq!(by_name.columns.numeric[1].name, "Price", "case-insensitive match, the header's spelling");
    assert_eq!(by_number.columns.target.as_ref().unwrap().name, "Total");
    assert_eq!(by_name.rows[0].line, 2, "lines count the header");
    assert_eq!(by_name.rows[2].dates, [61.0]);

    // Forced either way.
    let mut options = LoadOptions::new(schema("3", &["1"], &[], &[]));
    options.header = HeaderMode::Present;
    let t = load("1,2,3\n4,5,6\n7,8,9\n", &options).unwrap();
    assert_eq!((t.rows.len(), t.columns.target.as_ref().unwrap().name.as_str()), (2, "3"));
    options.header = HeaderMode::Absent;
    assert!(error("a,b,c\n4,5,6\n", &options).contains("t.csv:1:1: column 1: \"a\" is not a number"));

    // Names that do not resolve.
    let e = error(text, &LoadOptions::new(schema("Sum", &["Qty"], &[], &[])));
    assert_eq!(
        e,
        "t.csv: no column is named \"Sum\" (the header has: \"Qty\", \"Price\", \"Region\", \"When\", \"Total\")"
    );
    let e = error("1,2\n3,4\n", &LoadOptions::new(schema("total", &["1"], &[], &[])));
    assert!(e.contains("given by the name \"total\", but the file has no header row"), "{e}");
    let e = error(text, &LoadOptions::new(schema("9", &["1"], &[], &[])));
    assert_eq!(e, "t.csv: the target column is number 9, but the rows have 5 columns");
    let e = error("a,a,t\n1,2,3\n", &LoadOptions::new(schema("t", &["a"], &[], &[])));
    assert!(e.contains("2 columns are named \"a\" (numbers 1, 2)"), "{e}");
    let e = error(text, &LoadOptions::new(schema("Total", &["Qty", "5"], &[], &[])));
    assert_eq!(e, "t.csv: column 5 (Total) is chosen twice, as the target and as a numeric feature");
    assert!(error(text, &LoadOptions::new(schema("Total", &[], &[], &[]))).contains("no feature columns"));

    // Headerless files take names from the schema when it has them.
    let mut named = schema("total price", &["quantity"], &[], &[]);
    named.column_names = Some(vec!["quantity".into(), "total price".into()]);
    let t = load("2,9\n3,12\n", &LoadOptions::new(named)).unwrap();
    assert_eq!((t.header.clone(), t.columns.target.as_ref().unwrap().index, t.rows.len()), (None, 1, 2));

    assert_eq!(ColumnSpec::parse(" 12 ").unwrap(), ColumnSpec::Number(12));
    assert_eq!(ColumnSpec::parse("unit price").unwrap(), ColumnSpec::Name("unit price".into()));
    assert!(ColumnSpec::parse("0").unwrap_err().to_string().contains("start at 1"));
    assert!(ColumnSpec::parse("").is_err());
}

#[test]
fn quoted_fields_bom_and_crlf() {
    let text = "\u{feff}name,\"unit, price\",cat,total\r\n\"Mug, large\",\"4.5\",\"Home \"\"&\"\" Garden\",9\r\n\"multi\nline\",2,x,4\r\n";
    let t = load(text, &LoadOptions::new(schema("total", &["unit, price"], &["cat"], &[]))).unwrap();
    assert_eq!(t.header.as_ref().unwrap()[0], "name");
    assert_eq!(t.levels[0], ["Home \"&\" Garden", "x"]);
    assert_eq!(
        t.rows.iter().map(|r| (r.line, r.numeric[0], r.target)).collect::<Vec<_>>(),
        [(2, 4.5, 9.0), (3, 2.0, 4.0)]
    );
    // Blank lines, CR-only and mixed line ends count as lines.
    let o = LoadOptions::new(schema("2", &["1"], &[], &[]));
    for (text, line) in [("\n\n1,2\r\n\r\n3,x\r\n", 5), ("1,2\r3,4\rx,5\r", 3), ("1,2\n\r\n\n3,4\r\n5,6\n\n7,x", 7)] {
        assert!(error(text, &o).starts_with(&format!("t.csv:{line}:")), "{text:?}: {}", error(text, &o));
    }
    // A row after a field spanning two lines is numbered by the line it starts on.
    let e = error(&format!("{text}y,oops,x,1\n"), &LoadOptions::new(schema("total", &["unit, price"], &["cat"], &[])));
    assert_eq!(e, "t.csv:5:2: unit, price: \"oops\" is not a number");
}

const HEAD: &str = "qty,price,cat,day,total\n";

fn options() -> LoadOptions {
    LoadOptions::new(schema("total", &["qty", "price"], &["cat"], &["day"]))
}

#[test]
fn each_kind_of_bad_row_names_its_line_and_column() {
    let good = "2,4.5,a,2024-01-02,9\n";
    let cases = [
        ("2,4.5,a,2024-01-02\n", "t.csv:3:5: 4 fields, expected 5 (as in the first row): column 5 is missing"),
        ("2,4.5,a,2024-01-02,9,7\n", "t.csv:3:6: 6 fields, expected 5 (as in the first row)"),
        ("two,4.5,a,2024-01-02,9\n", "t.csv:3:1: qty: \"two\" is not a number"),
        ("2,,a,2024-01-02,9\n", "t.csv:3:2: price: empty field, expected a number"),
        ("2, ,a,2024-01-02,9\n", "t.csv:3:2: price: empty field, expected a number"),
        ("2,4.5,,2024-01-02,9\n", "t.csv:3:3: cat: empty field, expected a category"),
        ("2,4.5,a,,9\n", "t.csv:3:4: day: empty field, expected a date"),
        ("2,4.5,a,2024-01-02,\n", "t.csv:3:5: total: empty field, expected a number"),
        ("2,NaN,a,2024-01-02,9\n", "t.csv:3:2: price: \"NaN\" is not a number (NaN)"),
        ("2,4.5,a,2024-01-02,inf\n", "t.csv:3:5: total: \"inf\" is infinite"),
        ("-Infinity,4.5,a,2024-01-02,9\n", "t.csv:3:1: qty: \"-Infinity\" is infinite"),
        ("2,1e39,a,2024-01-02,9\n", "t.csv:3:2: price: \"1e39\" is beyond the range of 32-bit floats"),
        ("2,4.5,a,2024-02-30,9\n", "t.csv:3:4: day: \"2024-02-30\": February 2024 has no day 30"),
        (
            "2,4.5,a,soon,9\n",
            "t.csv:3:4: day: \"soon\" is not a date in any accepted format (ISO 8601 such as YYYY-MM-DD[THH:MM[:SS]] or YYYYMMDD[THHMMSS], YYYY/MM/DD, DD.MM.YYYY, DD/MM/YYYY or MM/DD/YYYY, D Mon YYYY, Mon D YYYY)",
        ),
        ("x,4.5,a,soon,9\n", "t.csv:3:1: qty: \"x\" is not a number"),
    ];
    for (bad, expected) in cases {
        let text = format!("{HEAD}{good}{bad}{good}");
        assert_eq!(error(&text, &options()), expected, "row {bad:?}");
        // Skipped instead: two good rows, one skipped, the same message kept.
        let t = load(&text, &skipping(options())).unwrap();
        assert_eq!((t.rows.len(), t.skipped, t.first_skipped.as_deref()), (2, 1, Some(expected)));
        assert_eq!(t.rows.iter().map(|r| r.line).collect::<Vec<_>>(), [2, 4]);
    }
    // Non-UTF-8 bytes in a used field.
    let mut bytes = format!("{HEAD}{good}").into_bytes();
    bytes.extend(b"2,4.5,\xff\xfe,2024-01-02,9\n");
    let e = Table::parse("t.csv", &bytes, &options()).unwrap_err().to_string();
    assert_eq!(e, "t.csv:3:3: cat: not valid UTF-8 text");
    // Unused columns are not checked.
    let t = load("n,qty,total\nanything,1,2\n,3,4\n", &LoadOptions::new(schema("total", &["qty"], &[], &[]))).unwrap();
    assert_eq!(t.rows.len(), 2);
}

#[test]
fn skipping_counts_bad_rows_and_reports_the_first() {
    let text = format!(
        "{HEAD}{}{}{}{}{}",
        "1,2,a,2024-01-01,2\n", "x,2,a,2024-01-01,2\n", "3,2,b,2024-01-05,6\n", "3,2,b\n", "4,2,b,2024-01-07,nan\n"
    );
    let t = load(&text, &skipping(options())).unwrap();
    assert_eq!(t.rows.len(), 2);
    assert_eq!(t.skipped, 3);
    assert_eq!(t.first_skipped.as_deref(), Some("t.csv:3:1: qty: \"x\" is not a number"));
    assert_eq!(error(&text, &options()), "t.csv:3:1: qty: \"x\" is not a number");
    let d = Dataset::from_table(&t, 0.5, SplitOrder::File, 0).unwrap();
    assert_eq!((d.skipped, d.train.rows, d.test.rows), (3, 1, 1));
}

#[test]
fn empty_all_bad_and_too_few_rows_are_clear_errors() {
    assert_eq!(error("", &options()), "t.csv is empty");
    assert_eq!(error("\n \n", &options()), "t.csv is empty");
    assert_eq!(error(HEAD, &options()), "t.csv has a header row but no data rows");
    let all_bad = format!("{HEAD}x,1,a,2024-01-01,1\n1,1,a,2024-13-01,1\n");
    assert_eq!(
        error(&all_bad, &skipping(options())),
        "t.csv: all 2 rows are bad; the first: t.csv:2:1: qty: \"x\" is not a number"
    );
    let one = load(&format!("{HEAD}1,1,a,2024-01-01,1\n"), &options()).unwrap();
    let e = Dataset::from_table(&one, 0.8, SplitOrder::File, 0).unwrap_err().to_string();
    assert_eq!(e, "t.csv: only 1 usable row, too few to split: at least one row must train and one test");
    let two = load(&format!("{HEAD}1,1,a,2024-01-01,1\n2,1,a,2024-01-01,2\n"), &options()).unwrap();
    for fraction in [0.8, 0.01, 0.99] {
        let d = Dataset::from_table(&two, fraction, SplitOrder::File, 0).unwrap();
        assert_eq!((d.train.rows, d.test.rows), (1, 1), "one row each side at {fraction}");
    }
    for fraction in [0.0, 1.0, -0.5, f64::NAN] {
        assert!(
            Dataset::from_table(&two, fraction, SplitOrder::File, 0)
                .unwrap_err()
                .to_string()
                .contains("between 0 and 1")
        );
    }
    let missing = Table::read(std::path::Path::new("/nonexistent/sales.tsv"), &options()).unwrap_err();
    assert!(format!("{missing:#}").starts_with("cannot open table /nonexistent/sales.tsv: "), "{missing:#}");
}

fn date(year: u16, month: u8, day: u8) -> DateValue {
    DateValue::Date { year, month, day }
}

#[test]
fn the_documented_date_formats_are_read() {
    for (text, expected) in [
        ("2024-03-05", date(2024, 3, 5)),
        ("2024-3-5", date(2024, 3, 5)),
        (" 2024-03-05 ", date(2024, 3, 5)),
        ("2024-03-05T14:22:01Z", date(2024, 3, 5)),
        ("2024-03-05 14:22", date(2024, 3, 5)),
        ("2024-03-05T14:22:01.123+05:30", date(2024, 3, 5)),
        ("2024-03-05T23:59:60-0800", date(2024, 3, 5)),
        ("2024/03/05", date(2024, 3, 5)),
        // ISO 8601's basic form, and date-times with a zone, as the King County house-sales table writes them.
        ("20141013T000000", date(2014, 10, 13)),
        ("20141013", date(2014, 10, 13)),
        ("20141013T130800Z", date(2014, 10, 13)),
        ("2014-10-13T13:08:00Z", date(2014, 10, 13)),
        ("2014-10-13T23:08:00-05:00", date(2014, 10, 13)),
        ("2014-10-13 13:08", date(2014, 10, 13)),
        ("05.03.2024", date(2024, 3, 5)),
        ("5.3.2024", date(2024, 3, 5)),
        ("5 Mar 2024", date(2024, 3, 5)),
        ("05-mar-2024", date(2024, 3, 5)),
        ("5 March 2024", date(2024, 3, 5)),
        ("Mar 5, 2024", date(2024, 3, 5)),
        ("March 5 2024", date(2024, 3, 5)),
        ("Sept 30, 2023", date(2023, 9, 30)),
        ("29 Feb 2024", date(2024, 2, 29)),
    ] {
        assert_eq!(parse_date(text), Ok(expected), "{text:?}");
    }
    assert_eq!(
        parse_date("25/12/2024"),
        Ok(DateValue::Slashed { first: 25, second: 12, year: 2024, order: Some(SlashOrder::DayMonth) })
    );
    assert_eq!(
        parse_date("12/25/2024"),
        Ok(DateValue::Slashed { first: 12, second: 25, year: 2024, order: Some(SlashOrder::MonthDay) })
    );
    assert_eq!(parse_date("03/04/2024"), Ok(DateValue::Slashed { first: 3, second: 4, year: 2024, order: None }));
    assert_eq!(
        (day_of_year(2024, 1, 1), day_of_year(2024, 3, 1), day_of_year(2023, 3, 1), day_of_year(2024, 12, 31)),
        (1, 61, 60, 366)
    );
    assert_eq!((day_of_year(2000, 12, 31), day_of_year(1900, 12, 31)), (366, 365));
}

#[test]
fn unreadable_dates_say_why() {
    let formats = format!("({})", textnet::sales::dates::DATE_FORMATS);
    for (text, expected) in [
        ("2024-13-01", "\"2024-13-01\": there is no month 13".to_string()),
        ("2023-02-29", "\"2023-02-29\": February 2023 has no day 29".to_string()),
        ("20141313", "\"20141313\": there is no month 13".to_string()),
        ("20230229T000000", "\"20230229T000000\": February 2023 has no day 29".to_string()),
        ("20140229T250000", "\"20140229T250000\": February 2014 has no day 29".to_string()),
        ("20240229T250000", "\"20240229T250000\": the time after the date is not HH:MM[:SS] (with an optional zone)".to_string()),
        ("31.04.2024", "\"31.04.2024\": April 2024 has no day 31".to_string()),
        ("32 Jan 2024", "\"32 Jan 2024\": January 2024 has no day 32".to_string()),
        ("03/04/24", "\"03/04/24\": the year must have four digits".to_string()),
        ("13/13/2024", "\"13/13/2024\" is no date as day/month/year (there is no month 13) nor as month/day/year (there is no month 13)".to_string()),
        ("2024-03-05T25:00", "\"2024-03-05T25:00\": the time after the date is not HH:MM[:SS] (with an optional zone)".to_string()),
        ("2024-03-05 noon", "\"2024-03-05 noon\": the time after the date is not HH:MM[:SS] (with an optional zone)".to_string()),
        ("yesterday", format!("\"yesterday\" is not a date in any accepted format {formats}")),
        ("1704153600", format!("\"1704153600\" is not a date in any accepted format {formats}")),
        ("2024-03", format!("\"2024-03\" is not a date in any accepted format {formats}")),
        ("5 Smarch 2024", format!("\"5 Smarch 2024\" is not a date in any accepted format {formats}")),
        ("2024.03.05", format!("\"2024.03.05\" is not a date in any accepted format {formats}")),
    ] {
        assert_eq!(parse_date(text), Err(expected), "{text:?}");
    }
}

#[test]
fn slashed_dates_follow_the_column_order() {
    let opts = || LoadOptions::new(schema("total", &["qty"], &[], &["day"]));
    // 25/12 settles day/month; 03/04 then reads as 3 April.
    let t = load("qty,day,total\n1,03/04/2024,1\n1,25/12/2024,1\n", &opts()).unwrap();
    assert_eq!(t.rows.iter().map(|r| r.dates[0]).collect::<Vec<_>>(), [94.0, 360.0]);
    // 12/25 settles month/day; 03/04 is 4 March.
    let t = load("qty,day,total\n1,03/04/2024,1\n1,12/25/2024,1\n", &opts()).unwrap();
    assert_eq!(t.rows.iter().map(|r| r.dates[0]).collect::<Vec<_>>(), [64.0, 360.0]);
    // Equal parts need no settling.
    let t = load("qty,day,total\n1,04/04/2024,1\n1,01/01/2024,1\n", &opts()).unwrap();
    assert_eq!(t.rows.iter().map(|r| r.dates[0]).collect::<Vec<_>>(), [95.0, 1.0]);
    // Nothing settles 03/04: an error for the table.
    let e = error("qty,day,total\n1,03/04/2024,1\n1,05/04/2024,1\n", &opts());
    assert_eq!(
        e,
        "t.csv: column 2 (day): dates such as 03/04/2024 (line 2) could be day/month/year or month/day/year, and no date in the column settles which; write them as YYYY-MM-DD"
    );
    // A date that reads only the other way than the column's: a bad row.
    let text = "qty,day,total\n1,25/12/2024,1\n1,12/26/2024,1\n1,01/02/2024,1\n";
    let expected = "t.csv:3:2: day: 12/26/2024 reads only as month/day/year, but this column is day/month/year (line 2 has 25/12/2024)";
    assert_eq!(error(text, &opts()), expected);
    let mut skip = opts();
    skip.skip_bad_rows = true;
    let t = load(text, &skip).unwrap();
    assert_eq!((t.rows.len(), t.skipped, t.first_skipped.as_deref()), (2, 1, Some(expected)));
    assert_eq!(t.rows[1].dates, [32.0]);
    // A bad row before any date settles the order is reported as itself.
    assert_eq!(
        error("qty,day,total\n1,03/04/2024,1\nx,05/04/2024,1\n1,25/12/2024,1\n", &opts()),
        "t.csv:3:1: qty: \"x\" is not a number"
    );
}

#[test]
fn one_hot_vocabulary_comes_from_the_training_rows() {
    let text = "qty,cat,total\n1,b,1\n2,a,2\n3,b,3\n4,c,4\n5,a,5\n";
    let t = load(text, &LoadOptions::new(schema("total", &["qty"], &["cat"], &[]))).unwrap();
    assert_eq!(t.levels[0], ["b", "a", "c"]);
    let d = Dataset::from_table(&t, 0.6, SplitOrder::File, 0).unwrap();
    assert_eq!(d.vocabularies, [vec!["b", "a"]]);
    assert_eq!(d.feature_names, ["qty", "cat=b", "cat=a"]);
    assert_eq!(d.train.x, [1.0, 1.0, 0.0, 2.0, 0.0, 1.0, 3.0, 1.0, 0.0]);
    // "c" was never seen in training: all zeros.
    assert_eq!(d.test.x, [4.0, 0.0, 0.0, 5.0, 0.0, 1.0]);
    assert_eq!(
        (d.train.y.clone(), d.test.y.clone(), d.test.lines.clone()),
        (vec![1.0, 2.0, 3.0], vec![4.0, 5.0], vec![5, 6])
    );
}

#[test]
fn features_are_laid_out_numeric_one_hot_then_dates() {
    let t = load(&sales_rows('\t'), &LoadOptions::new(Schema::sales_tsv())).unwrap();
    let d = Dataset::from_table(&t, 0.67, SplitOrder::File, 0).unwrap();
    assert_eq!((d.train.rows, d.test.rows), (2, 1));
    assert_eq!(d.feature_names, ["quantity", "unit price", "category=Home", "category=Office", "date (day of year)"]);
    assert_eq!(d.target_name, "total price");
    assert_eq!(d.train.row(1), [10.0, 1.25, 0.0, 1.0, 32.0]);
    assert_eq!(d.test.row(0), [1.0, 99.99, 0.0, 0.0, 366.0]);
}

#[test]
fn stats_are_the_training_split_mean_and_std() {
    let text = "qty,cat,total\n1,a,10\n3,a,30\n5,b,20\n7,a,40\n100,a,1000\n";
    let t = load(text, &LoadOptions::new(schema("total", &["qty"], &["cat"], &[]))).unwrap();
    let d = Dataset::from_table(&t, 0.8, SplitOrder::File, 0).unwrap();
    let s = Stats::of(&d.train);
    // qty 1,3,5,7: mean 4, population std √5; cat=a 1,1,0,1: mean 0.75, std √0.1875; total mean 25.
    assert_eq!(s.feature_mean, [4.0, 0.75, 0.25]);
    assert!((s.feature_std[0] - 5f32.sqrt()).abs() < 1e-6);
    assert!((s.feature_std[1] - 0.1875f32.sqrt()).abs() < 1e-6);
    assert_eq!((s.target_mean, s.target_std), (25.0, 125f32.sqrt()));
    let n = s.normalize(&d.train);
    for j in 0..3 {
        let col: Vec<f32> = (0..4).map(|i| n.row(i)[j]).collect();
        assert!(col.iter().sum::<f32>().abs() < 1e-5);
        assert!((col.iter().map(|v| v * v).sum::<f32>() / 4.0 - 1.0).abs() < 1e-5);
    }
    let test = s.normalize(&d.test);
    assert!((test.row(0)[0] - 96.0 / 5f32.sqrt()).abs() < 1e-4, "the test split uses the training stats");
    assert!((s.target_value(test.y[0]) - 1000.0).abs() < 1e-3);
    // A constant feature gets std 1 (and so stays finite).
    let t = load("qty,total\n2,1\n2,2\n2,3\n", &LoadOptions::new(schema("total", &["qty"], &[], &[]))).unwrap();
    let d = Dataset::from_table(&t, 0.67, SplitOrder::File, 0).unwrap();
    let s = Stats::of(&d.train);
    assert_eq!((s.feature_mean[0], s.feature_std[0]), (2.0, 1.0));
    assert_eq!(s.normalize(&d.test).x, [0.0]);
}

#[test]
fn the_split_is_in_file_order() {
    let text: String =
        std::iter::once("qty,total\n".to_string()).chain((1..=10).map(|i| format!("{i},{}\n", 2 * i))).collect();
    let t = load(&text, &LoadOptions::new(schema("total", &["qty"], &[], &[]))).unwrap();
    let d = Dataset::from_table(&t, 0.8, SplitOrder::File, 0).unwrap();
    assert_eq!(d.train.x, (1..=8).map(|i| i as f32).collect::<Vec<_>>());
    assert_eq!(d.test.x, [9.0, 10.0]);
    let d = Dataset::from_table(&t, 0.75, SplitOrder::File, 0).unwrap();
    assert_eq!((d.train.rows, d.test.rows), (8, 2), "7.5 rounds to 8");
}

/// A table sorted by its target, as many published tables are.
fn sorted_table(rows: usize) -> Table {
    let text: String = (0..rows).map(|i| format!("{i},1,a,2024-01-01,{i}\n")).collect();
    load(&format!("{HEAD}{text}"), &options()).unwrap()
}

#[test]
fn the_shuffled_split_is_seeded_and_mixes_a_sorted_table() {
    let t = sorted_table(200);
    let lines = |d: &Dataset| -> Vec<u64> { d.train.lines.iter().chain(&d.test.lines).copied().collect() };
    let a = Dataset::from_table(&t, 0.8, SplitOrder::Shuffled, 1).unwrap();
    let mut all = lines(&a);
    all.sort_unstable();
    assert_eq!(all, (2..202).collect::<Vec<u64>>(), "every row once");
    assert_eq!((a.train.rows, a.test.rows), (160, 40));
    assert_eq!(lines(&Dataset::from_table(&t, 0.8, SplitOrder::Shuffled, 1).unwrap()), lines(&a), "same seed");
    assert_ne!(lines(&Dataset::from_table(&t, 0.8, SplitOrder::Shuffled, 2).unwrap()), lines(&a), "other seed");
    // The test rows come from the whole table, not its top fifth.
    let mean = |y: &[f32]| y.iter().sum::<f32>() / y.len() as f32;
    assert!((mean(&a.test.y) - 99.5).abs() < 25.0, "test mean {}", mean(&a.test.y));
    assert_eq!(a.split_shift(), None);
    // In file order the test split is the top fifth, and the warning says so.
    let f = Dataset::from_table(&t, 0.8, SplitOrder::File, 1).unwrap();
    assert_eq!((mean(&f.test.y), f.test.lines[0]), (179.5, 162));
    let warning = f.split_shift().expect("a shifted split is named");
    assert!(warning.contains("test rows' total (mean 179.5000") && warning.contains("training rows'"), "{warning}");
}

/// A date column's calendar features: the year, then the day of year and the day of week on a circle, and
/// the time of day on a circle in a column where some value has a time other than midnight.
#[test]
fn calendar_features_of_a_date_column() {
    let circle = |at: f64, period: f64| {
        let angle = std::f64::consts::TAU * at / period;
        [angle.sin() as f32, angle.cos() as f32]
    };
    let mut schema = schema("y", &[], &[], &["when"]);
    schema.date_features = None;
    let options = LoadOptions::new(schema);
    // 13 October 2014 was a Monday (day 286 of 365), 1 January 2016 a Friday.
    let t = load("when,y\n2014-10-13T18:30,1\n2016-01-01,2\n", &options).unwrap();
    assert_eq!(t.date_features, [DateFeatures::Calendar { time_of_day: true }]);
    let want: Vec<f32> =
        [&[2014.0][..], &circle(285.0, 365.0), &circle(0.0, 7.0), &circle(18.5 * 60.0, 1440.0)].concat();
    assert_eq!(t.rows[0].dates, want);
    let want: Vec<f32> = [&[2016.0][..], &circle(0.0, 366.0), &circle(4.0, 7.0), &circle(0.0, 1440.0)].concat();
    assert_eq!(t.rows[1].dates, want);
    // Midnight only: no time-of-day features.
    let t = load("when,y\n20141013T000000,1\n20141014,2\n", &options).unwrap();
    assert_eq!(t.date_features, [DateFeatures::Calendar { time_of_day: false }]);
    assert_eq!(t.rows[1].dates.len(), 5);
    assert_eq!(parse_date_time("2014-10-13 13:08").map(|(_, m)| m), Ok(Some(13 * 60 + 8)));
    assert_eq!(parse_date_time("2014-10-13T13:08:00+02:00").map(|(_, m)| m), Ok(Some(13 * 60 + 8)));
    assert_eq!(parse_date_time("20141013").map(|(_, m)| m), Ok(None));
    assert_eq!(parse_date_time("13/10/2014").map(|(_, m)| m), Ok(None));
}

/// Rows to predict may leave the target empty or its column out; other widths are refused.
#[test]
fn rows_to_predict_need_no_target() {
    let mut options = LoadOptions::new(schema("3", &["1"], &["2"], &[]));
    options.width = Some(3);
    options.target_optional = true;
    let t = load("1,a,\n2,b,5\n", &options).unwrap();
    assert!(t.rows[0].target.is_nan());
    assert_eq!(t.rows[1].target, 5.0);
    let t = load("1,a\n2,b\n", &options).unwrap();
    assert_eq!(t.columns.target, None);
    assert!(t.rows.iter().all(|r| r.target.is_nan()));
    assert_eq!(t.levels, [vec!["a", "b"]]);
    // By name, with the target first: the other columns are found by their names.
    let mut options = LoadOptions::new(schema("y", &["x"], &["k"], &[]));
    options.width = Some(3);
    options.target_optional = true;
    let t = load("x,k\n1,a\n", &options).unwrap();
    assert_eq!(t.columns.target, None);
    assert_eq!(
        error("x,k,y,z\n1,a,2,3\n", &options),
        "t.csv has 4 columns, but the model reads 3 (or 2 without the target \"y\")"
    );
    // By number, with the target before a feature: the feature moves one to the left.
    let mut options = LoadOptions::new(schema("1", &["3"], &["2"], &[]));
    options.width = Some(3);
    options.target_optional = true;
    let t = load("a,7\nb,8\n", &options).unwrap();
    assert_eq!(t.rows[1].numeric, [8.0]);
}
