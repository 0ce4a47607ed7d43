"""Job settings: config files (YAML, TOML), SPARKSTATE_* variables, flags, and their order."""

from __future__ import annotations

import logging
import os

import pytest

from sparkstate.errors import ConfigError
from sparkstate.jobs.config import JobConfig, load_config, read_config_file, read_env


def test_toml_and_yaml_files_read_the_same(tmp_path):
    toml = tmp_path / "job.toml"
    toml.write_text('pipeline = "sessionize"\nsource = "files:in"\ntime-mode = "processing"\nonce = true\n'
                    '[options]\nmaxFilesPerTrigger = 1\n')
    yaml = tmp_path / "job.yml"
    yaml.write_text("pipeline: sessionize\nsource: files:in\ntime_mode: processing\nonce: yes\n"
                    "options: {maxFilesPerTrigger: 1}\n")
    assert read_config_file(toml) == read_config_file(yaml) == {
        "pipeline": "sessionize", "source": "files:in", "time_mode": "processing", "once": True,
        "options": {"maxFilesPerTrigger": "1"},
    }


def test_precedence_flags_env_file_defaults(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text('pipeline = "sessionize"\nsource = "files:file"\nsink = "json:file"\ntrigger = "5 seconds"\n'
                 'gap = "3 minutes"\ncheckpoint = "ck"\n')
    env = {"SPARKSTATE_SINK": "json:env", "SPARKSTATE_GAP": "2 minutes"}
    cfg = load_config(None, {"gap": "1 minute", "config": str(f)}, env)
    assert (cfg.source_spec.path, cfg.sink_spec.path, cfg.gap, cfg.trigger, cfg.watermark) == (
        os.path.abspath("file"), os.path.abspath("env"), "1 minute", "5 seconds", "10 seconds")
    assert load_config(None, {}, env, config_file=f).gap == "2 minutes"
    assert load_config(None, {}, {}, config_file=f).gap == "3 minutes"
    assert load_config("running-count", {"source": "files:x"}, {}).trigger == "1 second"


def test_master_flag_over_env_over_file_over_default(tmp_path):
    from sparkstate.cli import build_parser
    from sparkstate.cli._run import job_config

    f = tmp_path / "job.toml"
    f.write_text('master = "spark://file:7077"\n')
    env = {"SPARKSTATE_MASTER": "spark://env:7077", "SPARKSTATE_CONFIG": str(f)}
    parse = build_parser().parse_args
    flag = parse(["run", "running-count", "--source", "files:x", "--master", "spark://flag:7077"])
    bare = parse(["run", "running-count", "--source", "files:x"])
    assert job_config(flag, env).master == "spark://flag:7077"
    assert job_config(bare, env).master == "spark://env:7077"
    assert job_config(bare, {"SPARKSTATE_CONFIG": str(f)}).master == "spark://file:7077"
    assert job_config(bare, {}).master is None  # spark_session: local[*], or what spark-submit set
    with pytest.raises(ConfigError, match="master must be a Spark master URL such as spark://HOST:7077"):
        JobConfig("running-count", source="files:x", master=" ")


def test_env_reads_only_job_settings():
    env = {"SPARKSTATE_SPARK_LOG_LEVEL": "WARN", "SPARKSTATE_ONCE": "off",
           "SPARKSTATE_OPTIONS": "maxFilesPerTrigger=1, latestFirst=true", "HOME": "/root"}
    assert read_env(env) == {"once": False, "options": {"maxFilesPerTrigger": "1", "latestFirst": "true"}}
    with pytest.raises(ConfigError, match=r"environment: once: expected true or false, got 'sometimes'"):
        read_env({"SPARKSTATE_ONCE": "sometimes"})


def test_sessionize_settings_are_ignored_with_a_warning_elsewhere(caplog):
    with caplog.at_level(logging.WARNING, logger="sparkstate.jobs"):
        cfg = load_config("running-count", {"source": "files:in"}, {"SPARKSTATE_GAP": "5 minutes"})
    assert "gap" not in cfg.to_dict()
    assert "gap (from the environment) applies to sessionize only; running-count ignores it" in caplog.text


@pytest.mark.parametrize(
    "pipeline, source, settings, trigger",
    [
        ("running-count", "kafka:localhost:9092/words", {}, "0 seconds"),
        ("sessionize", "socket:9999", {}, "0 seconds"),
        ("sessionize", "kafka:localhost:9092/clicks", {"time_mode": "processing"}, "1 second"),
        ("running-count", "files:in", {}, "1 second"),
        ("sessionize", "generator", {}, "1 second"),
        ("running-count", "kafka:localhost:9092/words", {"trigger": "250 milliseconds"}, "250 milliseconds"),
        ("sessionize", "files:in", {"trigger": "0 seconds"}, "0 seconds"),
    ],
)
def test_the_trigger_defaults_to_none_only_where_nothing_would_run_back_to_back(pipeline, source, settings, trigger):
    cfg = JobConfig(pipeline, source=source, **settings)
    assert cfg.trigger == trigger
    assert cfg.given("trigger") == ("trigger" in settings)
    assert cfg.replace(once=True).trigger == trigger  # the default is decided again, not carried as given


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"pipeline": "sessionize", "source": "files:x", "gap": "soon"}, "run: gap: expected a duration such as '1 minute'"),
        ({"pipeline": "sessionize", "source": "files:x", "trigger": "-1 second"}, "run: trigger: expected a duration such as"),
        ({"pipeline": "sessionize", "source": "files:x", "watermark": "-1 second"}, "run: watermark"),
        ({"pipeline": "sessionize", "source": "files:x", "time_mode": "wall"}, "run: time-mode must be one of event, processing, got 'wall'"),
        ({"pipeline": "sessionize", "source": "files:x", "format": "xml"}, "format must be one of json, csv, parquet"),
        ({"pipeline": "sessionize", "source": ""}, "a source is required: --source SPEC"),
    ],
)
def test_bad_values(kwargs, message):
    with pytest.raises(ConfigError) as err:
        JobConfig(**kwargs)
    assert message in str(err.value)


def test_missing_pipeline_and_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="run: name the pipeline"):
        load_config(None, {"source": "files:x"}, {})
    with pytest.raises(ConfigError, match="expected a .yaml, .yml or .toml file"):
        read_config_file(tmp_path / "job.ini")
    bad = tmp_path / "bad.toml"
    bad.write_text("source = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        read_config_file(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="expected a mapping of settings"):
        read_config_file(listy)
    nested = tmp_path / "nested.yaml"
    nested.write_text("sink: {kind: console}\n")
    with pytest.raises(ConfigError, match="sink must be a single value, got dict"):
        read_config_file(nested)
    with pytest.raises(ConfigError, match="cannot read it"):
        read_config_file(tmp_path / "missing.toml")


def test_a_pipeline_setting_is_declared_once(monkeypatch, tmp_path):
    """A new pipeline with a setting of its own: one Setting in its declaration gives the flag,
    the variable, the config-file key, the default, the check and the help text."""
    from sparkstate.cli import build_parser
    from sparkstate.cli._run import job_config
    from sparkstate.jobs.pipelines import JOB_PIPELINES, JobPipeline
    from sparkstate.jobs.settings import Setting

    limit = Setting("top_n", "how many words to keep", 10, kind="count", metavar="N")
    monkeypatch.setitem(JOB_PIPELINES, "top-words", JobPipeline("top-words", "word string", "update",
                                                                lambda events, cfg, spark: events, settings=(limit,)))
    parser = build_parser()
    run = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict)).choices["run"]
    assert "top-words: how many words to keep (default: 10) [SPARKSTATE_TOP_N]" in " ".join(run.format_help().split())
    args = parser.parse_args(["run", "running-count", "--source", "files:x"])
    assert job_config(args, {"SPARKSTATE_TOP_N": "3"}).to_dict().get("top_n") is None  # another pipeline's: ignored
    cfg = load_config("top-words", {"source": "files:x"}, {"SPARKSTATE_TOP_N": "3"})
    assert cfg.top_n == 3
    f = tmp_path / "job.toml"
    f.write_text('top-n = 5\n')
    assert load_config("top-words", {"source": "files:x"}, {}, config_file=f).top_n == 5
    assert load_config("top-words", {"source": "files:x"}, {}).top_n == 10
    with pytest.raises(ConfigError, match=r"run: top-n is a whole number >= 0 \(0: no limit\), got '-1'"):
        load_config("top-words", {"source": "files:x", "top_n": "-1"}, {})
    with pytest.raises(ConfigError, match="run: top-n applies to top-words only, not to running-count"):
        JobConfig("running-count", source="files:x", top_n=1)


def test_processing_time_refuses_event_time_settings():
    with pytest.raises(ConfigError) as err:
        JobConfig("sessionize", source="files:x", time_mode="processing", watermark="5 seconds")
    assert str(err.value) == ("run: --watermark applies to --time-mode event; processing time has no watermark"
                              " (drop --watermark, or use --time-mode event)")
    with pytest.raises(ConfigError, match="run: --emit-on-last applies to --time-mode event"):
        JobConfig("sessionize", source="files:x", time_mode="processing", emit_on_last=True)
    assert JobConfig("sessionize", source="files:x", time_mode="processing").watermark == "10 seconds"


@pytest.mark.parametrize("kind", ["delay", "lateness"])  # lateness: the kind's earlier name (docs/api.md)
def test_a_delay_setting_takes_zero_and_refuses_what_is_not_a_duration(kind):
    from sparkstate.jobs.settings import Setting

    setting = Setting("pause", "a pause", "1 second", kind=kind)
    assert setting.value("0 seconds", "flags") == "0 seconds"
    assert setting.value(" 250 milliseconds ", "flags") == "250 milliseconds"
    with pytest.raises(ConfigError, match=r"run: pause: expected a duration"):
        setting.value("soon", "flags")
