"""CEL, the Cayuga Event Language: parser, semantic analysis and compiler to
automata (:mod:`air.model`)."""

from air.cel.compiler import CompiledQuery, compile_cel, validate
from air.cel.errors import CelError, CelNameError, CelSchemaError, CelSyntaxError, CelTypeError
from air.cel.parser import parse, parse_all

__all__ = ["parse", "parse_all", "compile_cel", "validate", "CompiledQuery", "CelError",
           "CelSyntaxError", "CelNameError", "CelTypeError", "CelSchemaError"]
