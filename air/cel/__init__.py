"""CEL, the Cayuga Event Language: parser, semantic analysis and compiler to
automata (:mod:`air.model`)."""

from air.cel.compiler import CompiledQuery, compile_cel, validate
from air.cel.errors import CelError, CelNameError, CelSchemaError, CelSyntaxError, CelTypeError
from air.cel.parser import parse, parse_all
from air.cel.shapes import COMPILER_VERSION, ShapeCache

__all__ = ["parse", "parse_all", "compile_cel", "validate", "CompiledQuery", "ShapeCache", "COMPILER_VERSION",
           "CelError", "CelSyntaxError", "CelNameError", "CelTypeError", "CelSchemaError"]
