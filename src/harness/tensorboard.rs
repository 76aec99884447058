//! TensorBoard event files, so that a run can be watched in TensorBoard as it trains: `--tensorboard DIR`
//! of every training command (through `report::Display`, which sees each epoch's row) and the Python
//! package's `textnet.tensorboard.SummaryWriter` (and so Keras-style `fit(tensorboard_dir=…)`).
//!
//! A file `events.out.tfevents.<seconds>.<host>.<pid>.<n>` in the directory holds TFRecords: each is the
//! length of its data as a little-endian u64, the masked CRC-32C of those 8 bytes, the data (one `Event`
//! message) and the data's masked CRC-32C. The first event names the file's version (`brain.Event:2`);
//! each later one holds a `Summary`: scalars at a step (`simple_value`, as torch.utils.tensorboard's
//! `add_scalar` writes them), or the HParams plugin's three summaries (`_hparams_/experiment`,
//! `_hparams_/session_start_info`, `_hparams_/session_end_info`, as its `add_hparams` writes them).
//!
//! The messages (`proto`) are the fields these need of TensorFlow's `event.proto` and `summary.proto` and
//! of the HParams plugin's `api.proto` and `plugin_data.proto`, with the same field numbers, encoded and
//! decoded by prost. Each event is flushed as it is written, so TensorBoard shows an epoch when it ends.

use anyhow::{Context, Result};
use prost::Message;
use serde_json::Value as Json;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The messages of an event file, as prost derives of the published `.proto` definitions (module comment).
#[allow(missing_docs)]
pub mod proto {
    /// `tensorflow.Event`: one record of the file.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Event {
        #[prost(double, tag = "1")]
        pub wall_time: f64,
        #[prost(int64, tag = "2")]
        pub step: i64,
        #[prost(oneof = "What", tags = "3, 5")]
        pub what: Option<What>,
    }

    /// `Event.what`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum What {
        #[prost(string, tag = "3")]
        FileVersion(String),
        #[prost(message, tag = "5")]
        Summary(Summary),
    }

    /// `tensorflow.Summary`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Summary {
        #[prost(message, repeated, tag = "1")]
        pub value: Vec<SummaryValue>,
    }

    /// `tensorflow.Summary.Value`: of its `value` oneof, only `simple_value` (a scalar).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SummaryValue {
        #[prost(string, tag = "1")]
        pub tag: String,
        #[prost(float, optional, tag = "2")]
        pub simple_value: Option<f32>,
        #[prost(message, optional, tag = "9")]
        pub metadata: Option<SummaryMetadata>,
    }

    /// `tensorflow.SummaryMetadata`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SummaryMetadata {
        #[prost(message, optional, tag = "1")]
        pub plugin_data: Option<PluginData>,
    }

    /// `tensorflow.SummaryMetadata.PluginData`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PluginData {
        #[prost(string, tag = "1")]
        pub plugin_name: String,
        #[prost(bytes = "vec", tag = "2")]
        pub content: Vec<u8>,
    }

    /// `tensorboard.hparams.HParamsPluginData`: the `content` of the plugin's summaries.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HParamsPluginData {
        #[prost(int32, tag = "1")]
        pub version: i32,
        #[prost(oneof = "HParamsData", tags = "2, 3, 4")]
        pub data: Option<HParamsData>,
    }

    /// `HParamsPluginData.data`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum HParamsData {
        #[prost(message, tag = "2")]
        Experiment(Experiment),
        #[prost(message, tag = "3")]
        SessionStartInfo(SessionStartInfo),
        #[prost(message, tag = "4")]
        SessionEndInfo(SessionEndInfo),
    }

    /// `tensorboard.hparams.Experiment`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Experiment {
        #[prost(double, tag = "3")]
        pub time_created_secs: f64,
        #[prost(message, repeated, tag = "4")]
        pub hparam_infos: Vec<HParamInfo>,
        #[prost(message, repeated, tag = "5")]
        pub metric_infos: Vec<MetricInfo>,
    }

    /// `tensorboard.hparams.HParamInfo`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HParamInfo {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(enumeration = "DataType", tag = "4")]
        pub r#type: i32,
    }

    /// `tensorboard.hparams.DataType`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum DataType {
        Unset = 0,
        String = 1,
        Bool = 2,
        Float64 = 3,
    }

    /// `tensorboard.hparams.MetricInfo`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MetricInfo {
        #[prost(message, optional, tag = "1")]
        pub name: Option<MetricName>,
    }

    /// `tensorboard.hparams.MetricName`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MetricName {
        #[prost(string, tag = "1")]
        pub group: String,
        #[prost(string, tag = "2")]
        pub tag: String,
    }

    /// `tensorboard.hparams.SessionStartInfo`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SessionStartInfo {
        #[prost(map = "string, message", tag = "1")]
        pub hparams: std::collections::HashMap<String, ProtoValue>,
        #[prost(string, tag = "4")]
        pub group_name: String,
        #[prost(double, tag = "5")]
        pub start_time_secs: f64,
    }

    /// `google.protobuf.Value`, less its list and struct kinds.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProtoValue {
        #[prost(oneof = "Kind", tags = "2, 3, 4")]
        pub kind: Option<Kind>,
    }

    /// `google.protobuf.Value.kind`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(double, tag = "2")]
        NumberValue(f64),
        #[prost(string, tag = "3")]
        StringValue(String),
        #[prost(bool, tag = "4")]
        BoolValue(bool),
    }

    /// `tensorboard.hparams.SessionEndInfo`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SessionEndInfo {
        #[prost(enumeration = "Status", tag = "1")]
        pub status: i32,
        #[prost(double, tag = "2")]
        pub end_time_secs: f64,
    }

    /// `tensorboard.hparams.Status`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum Status {
        Unknown = 0,
        Success = 1,
        Failure = 2,
        Running = 3,
    }
}

use proto::{Event, HParamsData, HParamsPluginData, Summary, SummaryValue};

/// The tags of the HParams plugin's summaries and its name, as the plugin reads them.
pub const EXPERIMENT_TAG: &str = "_hparams_/experiment";
/// The tag of the run's hyperparameters.
pub const SESSION_START_TAG: &str = "_hparams_/session_start_info";
/// The tag of how the run ended.
pub const SESSION_END_TAG: &str = "_hparams_/session_end_info";
const HPARAMS_PLUGIN: &str = "hparams";

/// The masked CRC-32C of TFRecord framing: the checksum rotated right by 15 bits plus a constant, so that a
/// checksum of data that holds checksums stays well spread.
pub fn masked_crc32c(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Seconds since the Unix epoch, as an event's `wall_time`.
fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// One event file being written.
#[derive(Debug)]
pub struct EventWriter {
    file: BufWriter<File>,
    path: PathBuf,
    /// The tags of the scalars written so far, in the order first written.
    tags: Vec<String>,
}

impl EventWriter {
    /// Creates `dir` (and its parents) if missing and a new event file in it, and writes the file's version
    /// event. The error says what is wrong with `dir` in one line, without naming it.
    pub fn create(dir: &Path) -> Result<EventWriter> {
        if dir.exists() && !dir.is_dir() {
            anyhow::bail!("not a directory");
        }
        std::fs::create_dir_all(dir).context("cannot create the directory")?;
        let host = gethostname::gethostname().to_string_lossy().replace(['/', '\\'], "_");
        let secs = now() as u64;
        // Several writers of one process in one second (a Python loop of runs) each get a file of their own.
        let mut n = 0;
        let (file, path) = loop {
            let path = dir.join(format!("events.out.tfevents.{secs}.{host}.{}.{n}", std::process::id()));
            match File::options().write(true).create_new(true).open(&path) {
                Ok(file) => break (file, path),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(e).context("cannot write a file in the directory"),
            }
        };
        let mut writer = EventWriter { file: BufWriter::new(file), path, tags: Vec::new() };
        writer.write(&Event {
            wall_time: now(),
            step: 0,
            what: Some(proto::What::FileVersion("brain.Event:2".into())),
        })?;
        Ok(writer)
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tags of the scalars written so far, in the order first written.
    pub fn tags(&self) -> &[String] {
        &self.tags
    }

    /// Writes `event` as one record and flushes it to the file.
    pub fn write(&mut self, event: &Event) -> Result<()> {
        let data = event.encode_to_vec();
        let length = (data.len() as u64).to_le_bytes();
        let mut record = Vec::with_capacity(data.len() + 16);
        record.extend_from_slice(&length);
        record.extend_from_slice(&masked_crc32c(&length).to_le_bytes());
        record.extend_from_slice(&data);
        record.extend_from_slice(&masked_crc32c(&data).to_le_bytes());
        self.file.write_all(&record).and_then(|()| self.file.flush()).with_context(|| self.cannot_write())
    }

    fn cannot_write(&self) -> String {
        format!("cannot write {}", self.path.display())
    }

    /// Scalars at `step`, one event holding them all (as `SummaryWriter.add_scalar` would write them one by
    /// one). TensorBoard stores them as f32.
    pub fn scalars(&mut self, step: u64, scalars: &[(String, f64)]) -> Result<()> {
        if scalars.is_empty() {
            return Ok(());
        }
        for (tag, _) in scalars {
            if !self.tags.contains(tag) {
                self.tags.push(tag.clone());
            }
        }
        let value = scalars
            .iter()
            .map(|(tag, v)| SummaryValue { tag: tag.clone(), simple_value: Some(*v as f32), metadata: None })
            .collect();
        self.write(&Event { wall_time: now(), step: step as i64, what: Some(proto::What::Summary(Summary { value })) })
    }

    /// The run's hyperparameters, as torch.utils.tensorboard's `add_hparams` writes them: the experiment
    /// (each hyperparameter's name and type, and the scalar tags `metrics` that the HParams dashboard shows
    /// beside them), the run's start with the values, and its end with `status`. `hparams` is a JSON
    /// object: numbers, strings and booleans as they are, null left out, anything else as its JSON text.
    pub fn hparams(
        &mut self,
        hparams: &serde_json::Map<String, Json>,
        metrics: &[String],
        status: proto::Status,
    ) -> Result<()> {
        use proto::{DataType, Kind, ProtoValue};
        let mut infos = Vec::new();
        let mut values = std::collections::HashMap::new();
        for (name, value) in hparams {
            let (kind, data_type) = match value {
                Json::Null => continue,
                Json::Bool(b) => (Kind::BoolValue(*b), DataType::Bool),
                Json::Number(n) => (Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)), DataType::Float64),
                Json::String(s) => (Kind::StringValue(s.clone()), DataType::String),
                other => (Kind::StringValue(other.to_string()), DataType::String),
            };
            infos.push(proto::HParamInfo { name: name.clone(), r#type: data_type as i32 });
            values.insert(name.clone(), ProtoValue { kind: Some(kind) });
        }
        let metric_infos = metrics
            .iter()
            .map(|tag| proto::MetricInfo { name: Some(proto::MetricName { group: String::new(), tag: tag.clone() }) })
            .collect();
        let time = now();
        let experiment = proto::Experiment { time_created_secs: time, hparam_infos: infos, metric_infos };
        let start = proto::SessionStartInfo { hparams: values, group_name: String::new(), start_time_secs: time };
        let end = proto::SessionEndInfo { status: status as i32, end_time_secs: time };
        for (tag, data) in [
            (EXPERIMENT_TAG, HParamsData::Experiment(experiment)),
            (SESSION_START_TAG, HParamsData::SessionStartInfo(start)),
            (SESSION_END_TAG, HParamsData::SessionEndInfo(end)),
        ] {
            let content = HParamsPluginData { version: 0, data: Some(data) }.encode_to_vec();
            let metadata = proto::SummaryMetadata {
                plugin_data: Some(proto::PluginData { plugin_name: HPARAMS_PLUGIN.into(), content }),
            };
            let value = vec![SummaryValue { tag: tag.into(), simple_value: None, metadata: Some(metadata) }];
            self.write(&Event { wall_time: time, step: 0, what: Some(proto::What::Summary(Summary { value })) })?;
        }
        Ok(())
    }
}

/// The events of the file at `path`, each record's checksums checked.
pub fn read_events(path: &Path) -> Result<Vec<Event>> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .with_context(|| format!("cannot read {}", path.display()))?;
    let bad = |what: &str| anyhow::anyhow!("{}: {what}", path.display());
    let mut events = Vec::new();
    let mut rest = &bytes[..];
    while !rest.is_empty() {
        let (length, tail) = rest.split_at_checked(12).ok_or_else(|| bad("a record cut short"))?;
        if u32::from_le_bytes(length[8..12].try_into()?) != masked_crc32c(&length[..8]) {
            return Err(bad("a record's length fails its checksum"));
        }
        let n = u64::from_le_bytes(length[..8].try_into()?) as usize;
        let (data, tail) = tail.split_at_checked(n).ok_or_else(|| bad("a record cut short"))?;
        let (crc, tail) = tail.split_at_checked(4).ok_or_else(|| bad("a record cut short"))?;
        if u32::from_le_bytes(crc.try_into()?) != masked_crc32c(data) {
            return Err(bad("a record's data fails its checksum"));
        }
        events.push(Event::decode(data).map_err(|e| bad(&format!("not an Event: {e}")))?);
        rest = tail;
    }
    Ok(events)
}

/// The plugin data of an HParams summary value, decoded.
pub fn hparams_data(value: &SummaryValue) -> Option<HParamsData> {
    let plugin = value.metadata.as_ref()?.plugin_data.as_ref()?;
    if plugin.plugin_name != HPARAMS_PLUGIN {
        return None;
    }
    HParamsPluginData::decode(&plugin.content[..]).ok()?.data
}

/// The tag a figure of the report is written under: `train_X`, `val_X` and `test_X` become `X/train`,
/// `X/val` and `X/test` (so that TensorBoard draws a figure's splits in one section), any other name is
/// kept (`lr`, `samples_per_s`).
pub fn tag(name: &str) -> String {
    for split in ["train", "val", "test"] {
        if let Some(figure) = name.strip_prefix(split).and_then(|n| n.strip_prefix('_')) {
            return format!("{figure}/{split}");
        }
    }
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_masked_checksum_is_tensorflows() {
        // crc32c("") = 0 and crc32c("123456789") = 0xe3069283 (RFC 3720's check value), masked as
        // tensorflow/core/lib/hash/crc32c.h masks them.
        assert_eq!(masked_crc32c(b""), 0xa282_ead8);
        assert_eq!(masked_crc32c(b"123456789"), 0xe306_9283_u32.rotate_right(15).wrapping_add(0xa282_ead8));
    }

    #[test]
    fn names_become_tags_by_split() {
        assert_eq!(tag("train_loss"), "loss/train");
        assert_eq!(tag("val_accuracy"), "accuracy/val");
        assert_eq!(tag("test_mae"), "mae/test");
        assert_eq!(tag("validation"), "validation");
        assert_eq!(tag("samples_per_s"), "samples_per_s");
    }

    #[test]
    fn events_written_read_back_with_their_checksums() {
        let dir = std::env::temp_dir().join(format!("textnet-tb-unit-{}", std::process::id()));
        let mut writer = EventWriter::create(&dir.join("a/b")).unwrap();
        writer.scalars(3, &[("loss/train".into(), 0.25)]).unwrap();
        let config = serde_json::json!({"lr": 0.5, "optim": "adam", "plot": null, "bias": true});
        writer.hparams(config.as_object().unwrap(), &["loss/train".into()], proto::Status::Success).unwrap();
        let path = writer.path().to_path_buf();
        drop(writer);
        let events = read_events(&path).unwrap();
        assert_eq!(events.len(), 5);
        assert_eq!(events[0].what, Some(proto::What::FileVersion("brain.Event:2".into())));
        let Some(proto::What::Summary(s)) = &events[1].what else { panic!("{:?}", events[1]) };
        assert_eq!((events[1].step, s.value[0].tag.as_str(), s.value[0].simple_value), (3, "loss/train", Some(0.25)));
        let Some(proto::What::Summary(s)) = &events[3].what else { panic!() };
        let Some(HParamsData::SessionStartInfo(start)) = hparams_data(&s.value[0]) else { panic!("{s:?}") };
        assert_eq!(start.hparams.len(), 3, "null is left out");
        assert_eq!(start.hparams["optim"].kind, Some(proto::Kind::StringValue("adam".into())));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[30] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(read_events(&path).unwrap_err().to_string().contains("checksum"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_in_the_way_is_refused() {
        let file = std::env::temp_dir().join(format!("textnet-tb-file-{}", std::process::id()));
        std::fs::write(&file, b"x").unwrap();
        let err = EventWriter::create(&file).err().unwrap().to_string();
        assert_eq!(err, "not a directory");
        std::fs::remove_file(&file).unwrap();
    }
}
