"""mTLS identity over real TLS on loopback: the verified client certificate names the tenant
(docs/design.md §2); no certificate is a 401, an unknown tenant a 403, a certificate from another CA
never gets past the handshake, and the guard keeps serving throughout."""

from __future__ import annotations

import ssl

import aiohttp
import httpx2
import openai
import pytest

from floorguard.proxy.config.guard import GuardServerConfig
from tests.integration.live import guard_config
from tests.pki import Authority

BODY = {"model": "m", "prompt": "hi", "max_tokens": 2}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    ca = Authority(directory)
    return {
        "ca": ca,
        "server": ca.issue("127.0.0.1"),
        "acme": ca.issue("acme", uri=("spiffe://tenants/free",)),
        "mallory": ca.issue("mallory"),
        "rogue": Authority(directory, "rogue CA").issue("acme"),
    }


def mtls_config(backend: str, pki, tenant_from: str = "cn") -> GuardServerConfig:
    config = guard_config(backend)
    return GuardServerConfig.model_validate(
        {
            **config.model_dump(by_alias=True, exclude={"identity", "tls"}),
            "identity": {"mode": "mtls", "mtls": {"tenant_from": tenant_from}},
            "tls": {
                "cert_file": pki["server"].cert,
                "key_file": pki["server"].key,
                "client_ca_file": pki["ca"].cert,
            },
        }
    )


def client_context(pki, who: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki["ca"].cert)
    if who is not None:
        context.load_cert_chain(pki[who].cert, pki[who].key)
    return context


def _post(live, url, context):
    async def go():
        async with (
            aiohttp.ClientSession() as session,
            session.post(url + "/v1/completions", json=BODY, ssl=context) as r,
        ):
            return r.status, await r.json(), r.headers.get("x-floorguard-decision")

    return live.run(go())


@pytest.fixture(scope="module")
def guard_url(live, pki):
    return live.guard(mtls_config(live.emulator(), pki))[0]


def test_the_certificate_common_name_is_the_tenant(live, guard_url, pki):
    status, payload, decision = _post(live, guard_url, client_context(pki, "acme"))
    assert (status, decision) == (200, "entitled")
    assert payload["usage"]["completion_tokens"] == 2


def test_no_certificate_is_401_and_an_unknown_tenant_403(live, guard_url, pki):
    status, payload, _ = _post(live, guard_url, client_context(pki, None))
    assert (status, payload["error"]["code"]) == (401, "missing_identity")
    status, payload, _ = _post(live, guard_url, client_context(pki, "mallory"))
    assert (status, payload["error"]["code"]) == (403, "unknown_tenant")


def test_a_certificate_from_another_ca_fails_the_handshake(live, guard_url, pki):
    with pytest.raises(aiohttp.ClientError):
        _post(live, guard_url, client_context(pki, "rogue"))
    status, _, _ = _post(live, guard_url, client_context(pki, "acme"))
    assert status == 200  # and the guard keeps serving


def test_the_openai_client_over_mtls(live, guard_url, pki):
    http_client = httpx2.Client(verify=client_context(pki, "acme"))
    client = openai.OpenAI(
        base_url=guard_url + "/v1", api_key="unused", http_client=http_client, max_retries=0
    )
    with http_client:
        chunks = list(client.completions.create(model="m", prompt="hi", max_tokens=3, stream=True))
    assert "".join(c.choices[0].text for c in chunks).count("tok") == 3


def test_a_uri_san_can_name_the_tenant(live, pki):
    url, _ = live.guard(mtls_config(live.emulator(), pki, tenant_from="san-uri"))
    status, payload, _ = _post(live, url, client_context(pki, "acme"))
    # the acme certificate's URI SAN names "spiffe://tenants/free": no contract by that name
    assert (status, payload["error"]["code"]) == (403, "unknown_tenant")
    assert "spiffe://tenants/free" in payload["error"]["message"]
