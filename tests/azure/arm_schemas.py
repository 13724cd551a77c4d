"""JSON Schemas of the Azure Resource Manager operations Archer's Azure provider calls, built from
Azure's official management SDKs on PyPI (azure-mgmt-compute, azure-mgmt-network), whose models
are generated from Azure's published REST API specification (azure-rest-api-specs). Nothing of the
specification is copied into this repository: the schemas are derived at test time from the
installed packages, and tests/common/arm.rs validates every request (and its own answers) with
a JSON Schema validator.

Per model, two schemas:
- `create`: what a PUT body may hold: the fields whose visibility includes "create", every other
  field refused (additionalProperties false, as Compute refuses an unknown member), the non-optional
  ones required;
- `read`: what a GET answers: every field, the non-optional ones required.

Output (stdout), one JSON document:
  {"apiVersions": {"compute": ..., "network": ...},
   "operations": {operationId: {"method", "path", "apiVersion", "request": schema|null, "response": schema}},
   "definitions": {"create.<Model>"|"read.<Model>": schema}}
"""

import datetime
import enum
import json
import re
import sys
import typing

import azure.mgmt.compute.models as compute_models
import azure.mgmt.compute.operations._operations as compute_ops
import azure.mgmt.network.models as network_models
import azure.mgmt.network.operations._operations as network_ops

DEFS = {}


def rest_fields(cls):
    """(rest name, annotation, visibility) of each field of a model class, parents first."""
    hints = typing.get_type_hints(cls, globalns={**vars(sys.modules[cls.__module__]), "_models": sys.modules[cls.__module__.rsplit(".", 1)[0]]})
    out = {}
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            if attr.startswith("_") or not hasattr(value, "_visibility") or not hasattr(value, "_rest_name_input"):
                continue
            name = value._rest_name_input or attr
            out[name] = (hints.get(attr), value._visibility)
    return out


def is_model(t):
    return isinstance(t, type) and hasattr(t, "_attr_to_rest_field") or (isinstance(t, type) and any(b.__name__ == "Model" for b in t.__mro__[1:]))


def schema_of(t, mode):
    """A JSON Schema of a Python annotation."""
    origin = typing.get_origin(t)
    args = typing.get_args(t)
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        # An extensible enum (Union[str, SomeEnum]) is any string, as the service takes it.
        if str in inner:
            return {"type": "string"}
        if len(inner) == 1:
            return schema_of(inner[0], mode)
        return {"anyOf": [schema_of(a, mode) for a in inner]}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (list, typing.List):
        return {"type": "array", "items": schema_of(args[0], mode) if args else {}}
    if origin in (dict, typing.Dict):
        return {"type": "object", "additionalProperties": schema_of(args[1], mode) if len(args) > 1 else {}}
    if t is str or t is bytes:
        return {"type": "string"}
    if t is bool:
        return {"type": "boolean"}
    if t is int:
        return {"type": "integer"}
    if t is float:
        return {"type": "number"}
    if t in (datetime.datetime, datetime.date, datetime.timedelta, datetime.time):
        return {"type": "string"}
    if t is typing.Any or t is object or t is None:
        return {}
    if isinstance(t, type) and issubclass(t, enum.Enum):
        return {"type": "string", "enum": [m.value for m in t]}
    if isinstance(t, type):
        return {"$ref": f"#/definitions/{define(t, mode)}"}
    return {}


def define(cls, mode):
    key = f"{mode}.{cls.__name__}"
    if key in DEFS:
        return key
    DEFS[key] = {}
    properties, required = {}, []
    for name, (hint, visibility) in rest_fields(cls).items():
        if mode == "create" and visibility is not None and "create" not in visibility:
            continue
        properties[name] = schema_of(hint, mode)
        optional = typing.get_origin(hint) is typing.Union and type(None) in typing.get_args(hint)
        if not optional and hint is not None:
            required.append(name)
    schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = sorted(required)
    # Polymorphic models (a discriminator with subtypes) keep their subtypes' fields open.
    if mode == "create" and not getattr(cls, "__mapping__", None):
        schema["additionalProperties"] = False
    DEFS[key] = schema
    return key


def operation(builder, model, response_model, method, paged=False, **path):
    """An operation as its request builder makes it: method, path template, api-version, and the
    schemas of its body and its answer (a page of `value` and `nextLink` when `paged`)."""
    request = builder(**path)
    url = request.url
    api_version = re.search(r"api-version=([0-9a-z-]+)", url).group(1)
    response = {"$ref": f"#/definitions/{define(response_model, 'read')}"} if response_model else None
    if paged and response:
        response = {"type": "object", "properties": {"value": {"type": "array", "items": response}, "nextLink": {"type": ["string", "null"]}}, "required": ["value"]}
    return {
        "method": method,
        "path": url.split("?")[0].replace("%7B", "{").replace("%7D", "}"),
        "apiVersion": api_version,
        "request": {"$ref": f"#/definitions/{define(model, 'create')}"} if model else None,
        "response": response,
    }


def main():
    ids = dict(subscription_id="{subscriptionId}", resource_group_name="{resourceGroupName}")
    vm = dict(vm_name="{vmName}", **ids)
    nic = dict(network_interface_name="{networkInterfaceName}", **ids)
    ops = {
        "VirtualMachines_CreateOrUpdate": operation(compute_ops.build_virtual_machines_create_or_update_request, compute_models.VirtualMachine, compute_models.VirtualMachine, "PUT", **vm),
        "VirtualMachines_Get": operation(compute_ops.build_virtual_machines_get_request, None, compute_models.VirtualMachine, "GET", **vm),
        "VirtualMachines_Delete": operation(compute_ops.build_virtual_machines_delete_request, None, None, "DELETE", **vm),
        "VirtualMachines_List": operation(compute_ops.build_virtual_machines_list_request, None, compute_models.VirtualMachine, "GET", paged=True, **ids),
        "NetworkInterfaces_CreateOrUpdate": operation(network_ops.build_network_interfaces_create_or_update_request, network_models.NetworkInterface, network_models.NetworkInterface, "PUT", **nic),
        "NetworkInterfaces_Get": operation(network_ops.build_network_interfaces_get_request, None, network_models.NetworkInterface, "GET", **nic),
        "NetworkInterfaces_Delete": operation(network_ops.build_network_interfaces_delete_request, None, None, "DELETE", **nic),
        "CommunityGalleryImageVersions_List": operation(
            compute_ops.build_community_gallery_image_versions_list_request,
            None,
            compute_models.CommunityGalleryImageVersion,
            "GET",
            paged=True,
            subscription_id="{subscriptionId}",
            location="{location}",
            public_gallery_name="{publicGalleryName}",
            gallery_image_name="{galleryImageName}",
        ),
    }
    doc = {"operations": ops, "definitions": DEFS}
    json.dump(doc, sys.stdout, sort_keys=True)


if __name__ == "__main__":
    main()
