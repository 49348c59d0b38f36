"""`floorguard serve`'s config: the built-in latency predictors are fitted on the configured
profile, with their options; without a profile they are refused at load."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from floorguard.errors import ConfigError
from floorguard.learners.latency import LatencyModel
from floorguard.profiles import get_profile, save_profile
from floorguard.proxy.config.guard import GuardServerConfig, load_config
from floorguard.proxy.process.app import GuardServer

BASE = {
    "contracts": [
        {"tenant": "acme", "class": "assured", "floor": 3, "deadline_ms": 1820},
        {"tenant": "free", "class": "opportunistic", "deadline_ms": 900},
    ],
    "backends": [{"url": "http://127.0.0.1:8001", "slots": 4}],
    "identity": {"mode": "header", "header": "X-Tenant", "trusted_upstreams": ["127.0.0.1/32"]},
}


def _load(tmp_path, **extra):
    path = tmp_path / "guard.yaml"
    path.write_text(yaml.safe_dump({**BASE, **extra}))
    return load_config(path)


def test_a_predictor_learner_is_fitted_on_the_profile_with_its_options(tmp_path):
    config = _load(tmp_path, learner="predictor-sheddable", learner_options={"beta": 0.5})
    options = config.learner_config()
    assert isinstance(options.latency_model, LatencyModel) and options.latency_model.r2 > 0.9
    assert options.beta == 0.5
    assert options.slo_s == pytest.approx(0.9)  # default: the opportunistic deadline
    explicit = _load(tmp_path, learner="predictor-agnostic", learner_options={"slo_ms": 700})
    assert explicit.learner_config().slo_s == pytest.approx(0.7)
    assert _load(tmp_path).learner_config().latency_model is None  # always-admit: no fit


def test_the_latency_model_saved_with_a_profile_is_used_not_refitted(tmp_path):
    """`floorguard calibrate` saves the predictor with the profile file, for its slots; the
    server loads that one (a profile file for other slots, or without one, is fitted)."""
    saved = LatencyModel((0.25, 0.01, 0.02, 0.003), 123, 0.97)
    profile = tmp_path / "profile.yaml"
    save_profile(get_profile("v100-moe"), profile, latency_model={"slots": 4, **saved.as_dict()})
    config = _load(tmp_path, learner="predictor-sheddable", profile=str(profile))
    assert config.learner_config().latency_model == saved
    other = {**BASE, "backends": [{"url": "http://127.0.0.1:8001", "slots": 2}]}
    (tmp_path / "guard.yaml").write_text(
        yaml.safe_dump({**other, "learner": "predictor-sheddable", "profile": str(profile)})
    )
    refitted = load_config(tmp_path / "guard.yaml").learner_config().latency_model
    assert refitted is not None and refitted.num_samples == 132 and refitted != saved


def test_a_saved_latency_model_with_a_bad_coefficient_is_a_config_error(tmp_path):
    profile = tmp_path / "profile.yaml"
    save_profile(
        get_profile("v100-moe"),
        profile,
        latency_model={"slots": 4, "coefficients": {"intercept": "fast"}},
    )
    config = _load(tmp_path, learner="predictor-sheddable", profile=str(profile))
    with pytest.raises(ConfigError, match=r"latency_model\.coefficients"):
        config.learner_config()


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"learner": "predictor-sheddable", "profile": None}, "config"),
        ({"learner_options": {"beta": -1}}, "learner_options.beta"),
        ({"learner_options": {"bogus": 1}}, "learner_options.bogus"),
    ],
)
def test_bad_learner_settings_are_refused_at_load(tmp_path, extra, key):
    with pytest.raises(ConfigError) as refused:
        _load(tmp_path, **extra)
    assert key in str(refused.value)


def test_an_admin_token_env_that_is_not_set_is_a_config_error_naming_it():
    """`admin.token_env` naming an unset variable must not silently leave the admin paths
    on their loopback default."""
    config = GuardServerConfig.model_validate({**BASE, "admin": {"token_env": "FG_ADMIN"}})
    with pytest.raises(ConfigError, match=r"admin\.token_env"):
        GuardServer(config, environ={})
    assert GuardServer(config, environ={"FG_ADMIN": "x" * 16}).admin_token == "x" * 16


def test_serve_warns_about_configs_outside_the_guarantee(monkeypatch):
    """The shipped example is outside docs/design.md §6 (d < s_max·(1 + ⌈B/C⌉)): `serve` says so
    before it guards; a deadline below the fastest service is named per tenant."""
    from floorguard.proxy.config.guard import GuardServerConfig, load_config  # noqa: PLC0415
    from floorguard.proxy.process.serve import start_warnings  # noqa: PLC0415

    monkeypatch.setenv("FLOORGUARD_JWT_SECRET", "s" * 40)
    example = load_config("examples/guard.yaml")
    assert start_warnings(example) == []  # the shipped example is inside its region
    data = example.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["contracts"][0]["floor"] = 6  # B = 6 of C = 4: s_max(16)·3 = 1.98 s > d
    warnings = start_warnings(GuardServerConfig.model_validate(data))
    assert len(warnings) == 1 and "outside docs/design.md §6" in warnings[0] and "SF" in warnings[0]
    for contract in data["contracts"]:
        contract["deadline_ms"] = 50
    tight = start_warnings(GuardServerConfig.model_validate(data))
    fate = "dropped as doomed" if example.doom_gate else "late, every one"
    assert any("tenant acme: deadline 50 ms" in w and fate in w for w in tight)


def test_serve_reports_the_region_and_the_screen_and_strict_refuses_outside(
    tmp_path, monkeypatch, capsys
):
    """Before it listens, `serve` prints docs/design.md §6's verdict and the screen's per assured
    contract; with `strict: true` a configuration outside the region exits 2, saying why."""
    from floorguard.cli import main  # noqa: PLC0415
    from floorguard.proxy.config.guard import load_config  # noqa: PLC0415
    from floorguard.proxy.process.serve import start_report  # noqa: PLC0415

    monkeypatch.setenv("FLOORGUARD_JWT_SECRET", "s" * 40)
    report = start_report(load_config("examples/guard.yaml"))
    assert report[0].startswith("docs/design.md §6 at ℓ = 16: inside")
    assert report[1].startswith("tenant acme: screen (makespan") and "ACCEPT" in report[1]
    data = yaml.safe_load(Path("examples/guard.yaml").read_text())
    data["contracts"][0]["floor"] = 6
    data["strict"] = True
    path = tmp_path / "strict.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "strict: true" in err and "refusing" in err
    assert "outside docs/design.md §6's region" in err


def test_a_typo_names_the_allowed_keys_and_a_missing_key_does_not_dump_its_parent(tmp_path):
    from floorguard.errors import ConfigError  # noqa: PLC0415
    from floorguard.proxy.config.guard import load_config  # noqa: PLC0415

    path = tmp_path / "g.yaml"
    body = (
        "contracts: [{tenant: acme, class: assured, floor: 2, deadline_ms: 1000}]\n"
        "identity: {mode: header, header: x-tenant, trusted_upstreams: [127.0.0.1/32]}\n"
    )
    path.write_text(body + "backends: [{url: 'http://127.0.0.1:8001', slot: 4}]\n")
    with pytest.raises(ConfigError) as typo:
        load_config(path)
    message = str(typo.value)
    assert "backends.0.slot" in message and "unknown key" in message
    assert "'slots'" in message and "'capacity'" in message  # the keys allowed there
    path.write_text(body + "backends: [{url: 'http://127.0.0.1:8001'}]\n")
    with pytest.raises(ConfigError) as missing:
        load_config(path)
    assert "backends.0.slots" in str(missing.value) and "required" in str(missing.value)
    assert "8001" not in str(missing.value)  # not the whole parent object


def test_every_config_error_is_reported_at_once_the_typo_first(tmp_path, capsys):
    """Five mistakes in one file: one run names all five (before, one a run), an unknown
    key first (a typo is also why a key then looks missing); `serve --check` exits 2."""
    from floorguard.cli import main  # noqa: PLC0415

    path = tmp_path / "g.yaml"
    path.write_text(
        "contracts:\n"
        "  - {tenant: acme, class: assured, floor: -1, deadline_ms: 1820, excess: reject}\n"
        "  - {tenant: free, class: opportunistik, deadline_ms: 0}\n"
        "backends: [{url: 'ftp://x', slots: 4}]\n"
        "identity: {mode: header, header: x-tenant, trusted_upstreams: [127.0.0.1/32]}\n"
    )
    assert main(["serve", "--check", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.index("contracts.0.excess") < err.index("and 4 more")
    for key in ("contracts.0.floor", "contracts.1.class", "contracts.1.deadline_ms",
                "backends.0.url"):  # fmt: skip
        assert key in err


def _pooled(**changes):
    config = {
        **{k: v for k, v in BASE.items() if k != "backends"},
        "models": {
            "llama": {"backends": [{"url": "http://127.0.0.1:8001", "slots": 4}]},
            "qwen": {"backends": [{"url": "http://127.0.0.1:8002", "slots": 2}]},
        },
        "contracts": [
            {"tenant": "acme", "class": "assured", "floor": 3, "deadline_ms": 1820,
             "models": ["llama"]},
            {"tenant": "acme", "class": "opportunistic", "deadline_ms": 900, "models": ["qwen"]},
            {"tenant": "free", "class": "opportunistic", "deadline_ms": 900},
        ],
        "store": {"url": "redis://127.0.0.1:6379/0", "prefix": "fg"},
    }  # fmt: skip
    return {**config, **changes}


def test_models_make_one_pool_each_with_the_contracts_that_cover_it():
    """A tenant may be assured on one model and opportunistic on another; a contract
    without `models` covers them all; each pool's floor keys live under its name."""
    pools = GuardServerConfig.model_validate(_pooled()).pools()
    assert list(pools) == ["llama", "qwen"]
    llama, qwen = pools["llama"].guard_config(), pools["qwen"].guard_config()
    assert [(c.tenant, c.cls.value) for c in llama.contracts] == [
        ("acme", "assured"),
        ("free", "opportunistic"),
    ]
    assert [(c.tenant, c.cls.value) for c in qwen.contracts] == [
        ("acme", "opportunistic"),
        ("free", "opportunistic"),
    ]
    assert (llama.slots, qwen.slots) == ((4,), (2,))
    assert pools["qwen"].store is not None and pools["qwen"].store.prefix == "fg:qwen"
    one = GuardServerConfig.model_validate(BASE).pools()
    assert list(one) == [None] and one[None].store is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"backends": BASE["backends"]}, "exactly one of them"),
        ({"models": {}}, "at least one model"),
        (
            {"models": {"a": {"backends": BASE["backends"]}, "b": {"backends": BASE["backends"]}}},
            "is in two pools",
        ),
        (
            {"contracts": [{"tenant": "acme", "class": "assured", "floor": 1, "deadline_ms": 900,
                            "models": ["mistral"]}]},
            "names model 'mistral'",
        ),
        (
            {"contracts": [{"tenant": "acme", "class": "assured", "floor": 1, "deadline_ms": 900},
                           {"tenant": "acme", "class": "opportunistic", "deadline_ms": 900,
                            "models": ["qwen"]}]},
            "two contracts covering model 'qwen'",
        ),
        (
            {"contracts": [{"tenant": "acme", "class": "assured", "floor": 1, "deadline_ms": 900,
                            "models": ["llama"]}]},
            "model 'qwen': no contract covers it",
        ),
    ],
)  # fmt: skip
def test_a_bad_models_section_is_refused_saying_why(tmp_path, changes, message):
    path = tmp_path / "guard.yaml"
    path.write_text(yaml.safe_dump(_pooled(**changes)))
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_contract_models_need_a_models_section(tmp_path):
    contracts = [{**BASE["contracts"][0], "models": ["llama"]}, BASE["contracts"][1]]
    with pytest.raises(ConfigError, match="needs a `models:` section"):
        _load(tmp_path, contracts=contracts)


def test_config_values_may_name_environment_variables(tmp_path):
    """`${NAME}` and `${NAME:-default}` in any string value; `$$` is a `$`; an unset variable
    is named in the error with the key that needs it."""
    path = tmp_path / "guard.yaml"
    config = {
        **BASE,
        "backends": [{"url": "${VLLM_URL}", "slots": 4}],
        "store": "redis://${REDIS_HOST:-127.0.0.1}:6379/0",
        "replica": "cost-$$5",
    }
    path.write_text(yaml.safe_dump(config))
    loaded = load_config(path, environ={"VLLM_URL": "http://vllm:8000"})
    assert loaded.backends[0].url == "http://vllm:8000"
    assert loaded.store is not None and loaded.store.url == "redis://127.0.0.1:6379/0"
    assert loaded.replica == "cost-$5"
    with pytest.raises(ConfigError, match=r"backends\[0\]\.url.*VLLM_URL is not set"):
        load_config(path, environ={})


def test_a_pool_with_no_assured_floor_starts_and_says_so(monkeypatch):
    """A guard in front of opportunistic tenants only (no floor to bound) reports that,
    instead of dying on docs/design.md §6's ρ_A, which has no value there."""
    from floorguard.proxy.process.serve import start_report, start_warnings  # noqa: PLC0415

    config = GuardServerConfig.model_validate(
        {
            "contracts": [{"tenant": "free", "class": "opportunistic", "deadline_ms": 60_000}],
            "backends": [{"url": "http://127.0.0.1:9", "slots": 4}],
            "identity": {
                "mode": "header",
                "header": "X-Tenant",
                "trusted_upstreams": ["127.0.0.0/8"],
            },
        }
    )
    assert start_report(config) == ["no assured floor: docs/design.md §6 has nothing to bound"]
    start_warnings(config)  # and the warnings do not die either


def test_the_start_report_screens_once_per_deadline_and_names_the_tenants_sharing_it():
    """Thousands of assured tenants were screened one by one (each screen the same but for
    its deadline): now once per distinct deadline, one line each, whose verdict is each
    tenant's own."""
    from floorguard.proxy.process.serve import start_report  # noqa: PLC0415

    deadlines = {"a": 4000, "b": 4000, "c": 4000, "d": 4000, "e": 600}
    config = GuardServerConfig.model_validate(
        {
            "profile": "v100-moe",
            "contracts": [
                {"tenant": t, "class": "assured", "floor": 1, "deadline_ms": d}
                for t, d in deadlines.items()
            ]
            + [{"tenant": "free", "class": "opportunistic", "deadline_ms": 4000}],
            "backends": [{"url": "http://127.0.0.1:9", "slots": 4}],
            "identity": {"mode": "header", "header": "X", "trusted_upstreams": ["127.0.0.0/8"]},
        }
    )
    screens = [line for line in start_report(config) if ": screen (" in line]
    assert len(screens) == 2
    assert screens[0].startswith("4 tenants (a, b, c, …): screen") and "d = 4000 ms" in screens[0]
    assert screens[1].startswith("tenant e: screen") and "d = 600 ms" in screens[1]
    assert "ACCEPT" in screens[0] and "REJECT" in screens[1]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"admin": {"port": 9100}}, "share the floor through a store"),
        ({"store": "redis://127.0.0.1:6379/0"}, r"need `admin\.port`"),
        ({"store": "redis://127.0.0.1:6379/0", "admin": {"port": 9100}, "port": 0}, "not 0"),
        ({"store": "redis://127.0.0.1:6379/0", "admin": {"port": 8079}}, "other than `port`"),
    ],
)
def test_workers_without_a_shared_floor_or_ports_of_their_own_are_refused(tmp_path, extra, message):
    """Apart, each worker would grant every tenant its whole floor; on the shared port a
    scrape of /metrics would reach any one of them."""
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, **{"workers": 2, "port": 8080, **extra})


def test_each_worker_has_its_own_name_logs_and_admin_port(tmp_path):
    config = _load(
        tmp_path,
        workers=3,
        replica="edge-a",
        store="redis://127.0.0.1:6379/0",
        admin={"port": 9100},
        decision_log=str(tmp_path / "decisions.jsonl"),
        access_log=str(tmp_path / "access.log"),
    )
    second = config.for_worker(1)
    assert second.replica.startswith("edge-a-w1-")
    assert second.decision_log == tmp_path / "decisions.w1.jsonl"
    assert second.access_log == str(tmp_path / "access.w1.log")
    assert second.admin.port == 9101 and second.port == config.port
    assert config.for_worker(0).replica != second.replica


def test_the_event_loop_is_said_and_uvloop_without_it_is_refused(tmp_path, monkeypatch):
    import importlib.util  # noqa: PLC0415

    from floorguard.proxy.process.serve import event_loop_line  # noqa: PLC0415

    installed = importlib.util.find_spec("uvloop") is not None
    assert event_loop_line(_load(tmp_path)).startswith(
        "event loop: uvloop" if installed else "event loop: asyncio"
    )
    assert event_loop_line(_load(tmp_path, event_loop="asyncio")) == (
        "event loop: asyncio (event_loop: asyncio)"
    )
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ConfigError, match=r"floorguard\[uvloop\]"):
        _load(tmp_path, event_loop="uvloop")
    assert event_loop_line(_load(tmp_path)).startswith("event loop: asyncio (uvloop is not")


def test_the_start_report_says_what_each_kv_cache_holds(tmp_path):
    from floorguard.proxy.process.serve import start_report  # noqa: PLC0415

    backends = [
        {"url": "http://127.0.0.1:8001", "slots": 4, "kv_tokens": 40_000},
        {"url": "http://127.0.0.1:8002", "slots": 4, "kv_tokens": 1_000},
        {"url": "http://127.0.0.1:8003", "slots": 4},
    ]
    config = _load(
        tmp_path, backends=backends, limits={"max_prompt_tokens": 2000, "max_tokens": 400}
    )
    lines = [line for line in start_report(config) if "KV" in line]
    assert lines == [
        "backend http://127.0.0.1:8001: KV 40000 tokens, 16 of the largest metered request "
        "(2400 tokens: max_prompt_tokens + max_tokens) at once",
        "backend http://127.0.0.1:8002: KV 1000 tokens, 0 of the largest metered request "
        "(2400 tokens: max_prompt_tokens + max_tokens) at once: such a request never starts "
        "there",
        "backend http://127.0.0.1:8003: KV not budgeted (slots only)",
    ]
    assert config.guard_config().kv_tokens == (40_000, 1_000, None)


def test_contracts_of_one_shape_share_their_set_of_given_fields():
    """100,000 tenants hold one set of given field names per shape, not one each (memory:
    `floorguard bench tenants --serve`); what each contract says was given is unchanged."""
    config = GuardServerConfig.model_validate(
        {
            "contracts": [
                {"tenant": "a", "class": "assured", "floor": 1, "deadline_ms": 900},
                {"tenant": "b", "class": "assured", "floor": 2, "deadline_ms": 800},
                {"tenant": "c", "class": "opportunistic", "deadline_ms": 900},
            ],
            "backends": [{"url": "http://b:8000", "slots": 4}],
            "identity": {"mode": "header", "header": "x-t", "trusted_upstreams": ["10.0.0.1/32"]},
        }
    )
    a, b, c = config.contracts
    assert a.__pydantic_fields_set__ is b.__pydantic_fields_set__
    assert c.__pydantic_fields_set__ is not a.__pydantic_fields_set__
    assert a.model_fields_set == {"tenant", "cls", "floor", "deadline_ms"}
    assert c.model_fields_set == {"tenant", "cls", "deadline_ms"}
    assert a.model_dump(exclude_unset=True) == {
        "tenant": "a", "cls": "assured", "floor": 1, "deadline_ms": 900.0
    }  # fmt: skip
