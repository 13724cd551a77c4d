"""ACR's token endpoints as ACR's data-plane client (azure-containerregistry 1.2.0, generated from
the 2021-07-01 model) calls them: each operation's form fields, the required ones, the grant
types and the api-version. The local ACR (tests/common/acr.rs) holds every request to this."""
import inspect
import json
from urllib.parse import parse_qs, urlparse

from azure.containerregistry._generated.models import _enums
from azure.containerregistry._generated.operations import _patch as ops


def fields(fn):
    params = [p for n, p in inspect.signature(fn).parameters.items() if n not in ("self", "kwargs")]
    return {"fields": [p.name for p in params], "required": [p.name for p in params if p.default is inspect.Parameter.empty]}


def api_version(build):
    return parse_qs(urlparse(build().url).query)["api-version"][0]


exchange = fields(ops.AuthenticationOperations.exchange_aad_access_token_for_acr_refresh_token)
exchange["grant_type"] = [e.value for e in _enums.PostContentSchemaGrantType]
exchange["api_version"] = api_version(ops.build_exchange_aad_access_token_for_acr_refresh_token_request)
token = fields(ops.AuthenticationOperations.exchange_acr_refresh_token_for_acr_access_token)
token["grant_type"] = [e.value for e in _enums.TokenGrantType]
token["api_version"] = api_version(ops.build_exchange_acr_refresh_token_for_acr_access_token_request)
print(json.dumps({"exchange": exchange, "token": token}))
