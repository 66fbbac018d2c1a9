"""Which classes and callbacks a payload may make a worker build or call.

A payload is data, never a recipe for code. A class named in a payload is resolved only if
its module is already imported (``sys.modules``), by a plain look-up in the module's
namespace: nothing is imported and no module ``__getattr__`` runs. It is built only if this
worker trusts it: it encoded it itself, it is defined in the spider's own top-level
package, it is listed in ``HA_CODEC_CLASSES``, it is a Request class of Scrapy, or it is a
``scrapy.Item`` subclass that only Scrapy's own code builds and fills (no class of its MRO
outside Scrapy defines a constructor, a hook or a property: inherited ones count). Every
imported library has dataclasses and Enums of its own (Twisted, redis, cryptography...), and
building one runs its ``__init__``, ``__post_init__`` or ``_missing_``: a payload must not
pick among them.

Callbacks and errbacks are bound methods of the spider: methods its own code defines (never
a dunder), or Scrapy's own callbacks (``parse``, ``CrawlSpider``'s rules, ``SitemapSpider``'s
sitemaps), never the spider's machinery (``_set_crawler``, ``start``...), even where the
spider's own code overrides it, nor the hooks Scrapy calls by name (``closed``,
``start_requests``); they are found in the class namespaces (``inspect.getattr_static``), so
no property runs.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
from types import FunctionType, MethodType, ModuleType
from typing import TYPE_CHECKING, Any

from scrapy.item import Field, Item, ItemMeta

from scrapy_ha.codec.document import (
    CODEC_CLASSES_SETTING,
    CodecError,
    Unstorable,
    setting_names,
    type_name,
)

attr_module: ModuleType | None
try:  # attrs ships with Twisted, but an item class check must not need it
    import attr as attr_module
except ImportError:  # pragma: no cover - Twisted depends on attrs
    attr_module = None

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Spider

#: Classes this process encoded (class -> stored name): a worker trusts what it stored.
NAMES: dict[type, str] = {}

#: Methods defined by Scrapy's (and scrapy-ha's) own spider classes that serve as callbacks:
#: ``parse``, the rules of ``CrawlSpider`` and its ``parse_start_url`` (a hook Scrapy calls
#: with a response, which a spider overrides and yields requests to), the sitemaps of
#: ``SitemapSpider``. Every other
#: method those classes define (``_set_crawler``, ``start``, ``update_settings``...) is the
#: spider's machinery, which a payload must never make a worker call.
_FRAMEWORK_CALLBACKS = frozenset(
    ("parse", "_parse", "_callback", "_errback", "_parse_sitemap", "parse_start_url")
)
_FRAMEWORK_PACKAGES = frozenset(("scrapy", "scrapy_ha", "scrapy_redis"))
#: Methods Scrapy calls on a spider by name that its classes do not define: the spider's
#: own code defines them, and they are machinery all the same (``closed(reason)`` ends it).
_SPIDER_HOOKS = frozenset(("closed", "start_requests"))


# --------------------------------------------------------------------------- classes


def class_name(cls: type, url: str | None) -> str:
    """``module:Qualname`` of *cls*, checked to resolve back to *cls* on decoding.

    Raises :class:`CodecError` naming *url* (a request's own class), or :class:`Unstorable`
    without one (a class inside a value).
    """
    name = NAMES.get(cls)
    if name is not None:
        return name
    name = f"{cls.__module__}:{cls.__qualname__}"
    try:
        found = lookup(name)
    except CodecError:
        found = None
    if found is not cls:
        why = (
            f"the class {name} cannot be found again by its name: define it at a module's top level"
        )
        if url is not None:
            raise CodecError(f"cannot store the request for {url}: {why}")
        raise Unstorable(type_name(cls), why)
    NAMES[cls] = name
    return name


def lookup(name: str) -> Any:
    """The object *name* designates in an already imported module; never imports, never runs
    code (no ``getattr``: a module's ``__getattr__`` could import)."""
    module_name, sep, qualname = name.partition(":")
    if not sep:  # the form of older payloads: "package.module.Class"
        module_name, _, qualname = name.rpartition(".")
    module = sys.modules.get(module_name)
    if module is None:
        raise CodecError(
            f"the payload names {name!r}, whose module is not imported in this worker "
            f"(scrapy-ha never imports a module a payload names: import it in the spider's module)"
        )
    obj: Any = module
    for part in qualname.split("."):
        if not isinstance(obj, (ModuleType, type)):
            obj = None
            break
        obj = vars(obj).get(part)
    if obj is None:
        raise CodecError(f"the payload names {name!r}, which does not exist")
    return obj


def trusted(cls: type, spider: Spider | None) -> bool:
    """May a payload make this worker build *cls*? (See the module docstring.)"""
    if cls in NAMES or _is_scrapy_item(cls):
        return True  # built by Scrapy's own Item code alone (a dict of fields)
    module = cls.__module__ or ""
    if spider is not None:
        top = type(spider).__module__.partition(".")[0]
        if top not in ("scrapy", "builtins") and (module == top or module.startswith(top + ".")):
            return True
    return _listed(cls, spider)


def _is_scrapy_item(cls: type) -> bool:
    """A ``scrapy.Item`` subclass that building, filling, hashing, comparing and reading
    runs Scrapy's own code for alone: no class of its MRO (nor of its metaclass's) outside
    Scrapy's defines behaviour of its own (see :func:`_adds_behaviour`), wherever it is
    inherited from. A library's base class with an ``__init__`` or a ``__setitem__`` makes
    every item class built on it untrusted until listed in ``HA_CODEC_CLASSES``."""
    if not issubclass(cls, Item):
        return False
    return not any(_adds_behaviour(k, Item) for k in cls.__mro__) and not any(
        _adds_behaviour(k, ItemMeta) for k in inspect.getmro(type(cls))
    )


#: What Python and Scrapy's ItemMeta write into every class body: data, not behaviour.
_BOOKKEEPING = frozenset(
    (
        "__module__",
        "__qualname__",
        "__doc__",
        "__dict__",
        "__weakref__",
        "__annotations__",
        "__annotate__",
        "__annotate_func__",
        "__annotations_cache__",
        "__firstlineno__",
        "__static_attributes__",
        "__orig_bases__",
        "__parameters__",
        "__abstractmethods__",
        "_abc_impl",
        "fields",
        "_class",
    )
)


@functools.cache
def _names_of(base: type) -> frozenset[str]:
    """Every name the classes of *base*'s MRO define."""
    return frozenset(name for k in base.__mro__ for name in vars(k))


def _adds_behaviour(klass: type, base: type) -> bool:
    """Does *klass*, a class of an item class's MRO (or of its metaclass's MRO when *base*
    is ``ItemMeta``), define code that building or using the item may run?

    Scrapy's own classes (those of *base*'s MRO) do not count. Any other class may define
    fields, constants and methods of new names; a dunder (``__init__``, ``__new__``,
    ``__setitem__``, ``__setattr__``, ``__getattribute__``, ``__hash__``, ``__eq__``,
    ``__del__``, a metaclass's ``__call__``...), a name Scrapy's classes define
    (``keys``, ``copy``...: what the mapping protocol calls) or a data descriptor (a
    property, which an attribute assignment runs) is behaviour.
    """
    if klass in base.__mro__:
        return False
    scrapys = _names_of(base)
    for name, value in vars(klass).items():
        if name in _BOOKKEEPING or isinstance(value, Field):
            continue
        dunder = name.startswith("__") and name.endswith("__")
        setter = hasattr(type(value), "__set__") or hasattr(type(value), "__delete__")
        if dunder or name in scrapys or setter:
            return True
    return False


def _listed(cls: type, spider: Spider | None) -> bool:
    settings = getattr(getattr(spider, "crawler", None), "settings", None)
    if settings is None:
        return False
    try:
        names = setting_names(settings.get(CODEC_CLASSES_SETTING))
    except ValueError:  # (refused at the worker's start)
        return False
    return f"{cls.__module__}:{cls.__qualname__}" in names or type_name(cls) in names


def untrusted(name: str) -> CodecError:
    """The error for a payload naming a class this worker does not trust."""
    return CodecError(
        f"the payload names the class {name!r}, which this worker has not stored itself and "
        f"which is not defined in the spider's package: add it to {CODEC_CLASSES_SETTING} "
        f"to let payloads build it"
    )


# --------------------------------------------------------------------------- items


def item_kind(cls: type) -> str | None:
    """``"scrapy"``, ``"dataclass"``, ``"attrs"`` or ``"pydantic"`` for an item class."""
    if issubclass(cls, Item):
        return "scrapy"
    if dataclasses.is_dataclass(cls):
        return "dataclass"
    if attr_module is not None and attr_module.has(cls):
        return "attrs"
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and issubclass(cls, pydantic.BaseModel):
        return "pydantic"
    return None


def item_fields(item: Any, kind: str) -> dict[str, Any]:
    """The fields of *item* (of :func:`item_kind` *kind*) by name."""
    if kind == "scrapy":
        return dict(item)
    if kind == "dataclass":
        return {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
    if kind == "attrs" and attr_module is not None:
        return {a.name: getattr(item, a.name) for a in attr_module.fields(type(item))}
    return {name: getattr(item, name) for name in type(item).model_fields}


def build_item(cls: type, kind: str, fields: dict[str, Any]) -> Any:
    """An item of the trusted class *cls* with *fields*, through its own constructor."""
    if kind == "scrapy":
        return cls(fields)
    if kind == "pydantic":  # pydantic is optional: its model class has no static type here
        model: Any = cls
        return model.model_construct(**fields)
    spec = _init_spec(cls, kind)
    unknown = set(fields) - {name for name, _, _ in spec}
    if unknown:
        raise CodecError(f"{type_name(cls)} has no fields {sorted(unknown)}")
    item = cls(**{arg: fields[name] for name, arg, init in spec if init and name in fields})
    for name, _arg, init in spec:
        if not init and name in fields:
            object.__setattr__(item, name, fields[name])
    return item


def _init_spec(cls: type, kind: str) -> list[tuple[str, str, bool]]:
    """(field name, ``__init__`` argument, taken by ``__init__``) of a dataclass or attrs class."""
    if kind == "dataclass":
        return [(f.name, f.name, f.init) for f in dataclasses.fields(cls)]
    assert attr_module is not None  # item_kind found an attrs class
    return [
        (a.name, getattr(a, "alias", a.name.lstrip("_")), a.init) for a in attr_module.fields(cls)
    ]


# --------------------------------------------------------------------------- callbacks


def callback_name(spider: Spider | None, func: Callable[..., Any], url: str, attr: str) -> str:
    """The name to store for *func*, the *attr* (callback or errback) of the request for *url*."""
    name = getattr(func, "__name__", "")
    bound = getattr(spider, name, None) if spider is not None else None
    if bound is not None and getattr(bound, "__func__", None) is getattr(func, "__func__", func):
        assert spider is not None  # bound is not None
        if not _callable_name(spider, name):
            raise CodecError(
                f"cannot store the request for {url} in Redis: its {attr} {name!r} is part "
                f"of Scrapy's spider machinery, which a worker never calls from a payload; "
                f"use a method of your own spider class"
            )
        return name
    raise CodecError(
        f"cannot store the request for {url} in Redis: its {attr} {func!r} is not a "
        f"method of the spider (use a spider method, pass data in cb_kwargs)"
    )


def _static_lookup(cls: type, name: str) -> Any:
    """``inspect.getattr_static(cls, name)``, read directly where every class of *cls*'s
    MRO is made by ``type`` itself (a spider's, unless a metaclass of its own): that
    function then returns the first hit in the class namespaces in MRO order (no metaclass
    can shadow ``__dict__``), at half its cost on Python 3.11. A name none of them holds
    is looked up by it (it looks in the metaclass then)."""
    mro = type.__dict__["__mro__"].__get__(cls)
    if all(type(klass) is type for klass in mro):
        for klass in mro:
            namespace = vars(klass)
            if name in namespace:
                return namespace[name]
    return inspect.getattr_static(cls, name)


def _callable_name(spider: Spider, name: str) -> bool:
    """A callback name a payload may use: a method the spider's own code defines (public
    or private, never a dunder, never one of Scrapy's hooks: an override of ``start`` or
    ``_set_crawler``, a ``closed``), or one of Scrapy's own callbacks (see above); found in
    the class namespaces, so nothing runs to find it."""
    if name.startswith("__") or name in _SPIDER_HOOKS:
        return False
    found = False
    for klass in type(spider).__mro__:
        if name in vars(klass):
            framework = klass.__module__.split(".")[0] in _FRAMEWORK_PACKAGES
            if framework and name not in _FRAMEWORK_CALLBACKS:
                return False  # the machinery, whoever overrides it
            found = True
    return found


def callback_method(spider: Spider | None, name: Any) -> Callable[..., Any]:
    """The spider's method *name*, bound to the spider.

    Only a plain function in the class namespaces (``inspect.getattr_static``: no property,
    no descriptor and no ``__getattr__`` runs to find it) that the spider's own code defines,
    or one of Scrapy's callbacks (:func:`_callable_name`): ``_set_crawler`` or ``__init__``
    are the spider's machinery, not callbacks.
    """
    ok = isinstance(name, str) and spider is not None and _callable_name(spider, name)
    try:
        func = _static_lookup(type(spider), name) if ok else None
    except AttributeError:
        func = None
    if not isinstance(func, FunctionType):
        raise CodecError(f"the spider has no callback method {name!r}")
    return MethodType(func, spider)
