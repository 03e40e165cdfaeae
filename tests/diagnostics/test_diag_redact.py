from __future__ import annotations

import pytest

from supervisor.common.redact import REDACTED, Redactor, argv_secrets, secret_key, secret_name


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("HF_TOKEN", True),
        ("MY_API_KEY", True),
        ("DB_PASSWORD", True),
        ("mysql_passwd", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("PROXY_AUTH", True),
        ("CUDA_VISIBLE_DEVICES", False),
        ("PATH", False),
        ("NCCL_P2P_DISABLE", False),
    ],
)
def test_env_keys_follow_the_documented_globs(key: str, secret: bool) -> None:
    assert secret_key(key) is secret


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("--api-key", True),
        ("--hf-token", True),
        ("apiKey", True),
        ("--tokenizer-path", False),
        ("max_total_num_tokens", False),
        ("--max-total-tokens", False),
    ],
)
def test_names_in_text_match_by_word(name: str, secret: bool) -> None:
    assert secret_name(name) is secret


def test_env_values_of_secret_keys_and_url_passwords_are_hidden() -> None:
    env = {
        "HF_TOKEN": "hf_secret123",
        "DATABASE_URL": "postgres://bob:urlpass55@db:5432/x",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    r = Redactor.from_envs([env])
    out = r.env(env)
    assert out["HF_TOKEN"] == REDACTED
    assert out["DATABASE_URL"] == f"postgres://bob:{REDACTED}@db:5432/x"
    assert out["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_literal_values_are_scrubbed_anywhere() -> None:
    r = Redactor.from_envs([{"HF_TOKEN": "hf_secret123", "SOME_KEY": "1"}])
    text = r.text("downloading with hf_secret123 now; flag 1 stays")
    assert "hf_secret123" not in text
    assert "flag 1 stays" in text  # short values are not scrubbed everywhere


@pytest.mark.parametrize(
    ("raw", "gone"),
    [
        ("Authorization: Bearer tok_abcdef123", "tok_abcdef123"),
        ("curl -H 'authorization: Basic dXNlcjpwYXNz'", "dXNlcjpwYXNz"),
        ("launch --api-key sk-argv-4242 --port 1", "sk-argv-4242"),
        ("launch --api-key=sk-argv-4242", "sk-argv-4242"),
        ("HF_TOKEN=hf_abc123 python x.py", "hf_abc123"),
        ("ServerArgs(api_key='sk-in-args', tp_size=8)", "sk-in-args"),
        ('{"password": "hunter22", "user": "x"}', "hunter22"),
        ("fetch https://user:p4ssw0rd@example.com/x", "p4ssw0rd"),
        ("GET /x?token=qs-secret-1&a=2", "qs-secret-1"),
    ],
)
def test_patterns_in_free_text(raw: str, gone: str) -> None:
    out = Redactor().text(raw)
    assert gone not in out
    assert REDACTED in out


def test_free_text_keeps_sglang_figures() -> None:
    line = "KV Cache is allocated. #tokens: 1000, max_total_num_tokens=123456 --tokenizer-path /m"
    assert Redactor().text(line) == line


def test_argv_hides_values_of_secret_flags() -> None:
    argv = ("python3", "-m", "sglang.launch_server", "--api-key", "sk-1234567", "--tp-size", "8",
            "--hf-token=hf_abcdef", "--model-path", "s3://u:pw12345@bucket/m")  # fmt: skip
    out = Redactor().argv(argv)
    assert out[4] == REDACTED
    assert out[6] == "8"
    assert out[7] == f"--hf-token={REDACTED}"
    assert out[9] == f"s3://u:{REDACTED}@bucket/m"


def test_obj_redacts_keys_and_nested_strings() -> None:
    doc = {"token": "abc", "nested": [{"Authorization": "Bearer zzzzzz"}], "n": 3, "api_key": {"a": "b"}}
    out = Redactor().obj(doc)
    assert out == {"token": REDACTED, "nested": [{"Authorization": REDACTED}], "n": 3, "api_key": {"a": "b"}}


def test_argv_secret_values_become_literals() -> None:
    argv = ("x", "--api-key", "sk-argv-4242", "--hf-token=hf_tok_777", "--db", "mysql://u:pw-abc-9@h/d")
    assert argv_secrets(argv) == ["sk-argv-4242", "hf_tok_777", "pw-abc-9"]
    r = Redactor.from_envs([], extra=argv_secrets(argv))
    assert "sk-argv-4242" not in r.text("ServerArgs(api_key=sk-argv-4242, x) and sk-argv-4242 alone")


def test_assignment_inside_a_call_is_found() -> None:
    out = Redactor().text("server_args=ServerArgs(model_path='/m', api_key='sk-in-args', tp_size=8)")
    assert "sk-in-args" not in out and "model_path='/m'" in out and "tp_size=8" in out


def test_figures_under_secret_looking_keys_are_kept() -> None:
    from supervisor.common.redact import Redactor

    doc = Redactor().obj({"figures": {"tokens": 1234.0, "running_reqs": 3}, "api_key": "sk-123456789", "token": None})
    assert doc == {"figures": {"tokens": 1234.0, "running_reqs": 3}, "api_key": "[redacted]", "token": None}
