"""The IR: graphs, the op catalogue, the builder DSL, the float64 interpreter and dumps."""

from fusiontune.ir.autodiff import cotangent_name, grad_graph, gradient_name
from fusiontune.ir.builder import GraphBuilder, Tensor
from fusiontune.ir.graph import Graph, GraphEditor, Node, Value
from fusiontune.ir.interpreter import random_inputs, run_graph
from fusiontune.ir.ops import CATALOGUE, OpDef, get_op

__all__ = [
    "CATALOGUE",
    "Graph",
    "GraphBuilder",
    "GraphEditor",
    "Node",
    "OpDef",
    "Tensor",
    "Value",
    "cotangent_name",
    "get_op",
    "grad_graph",
    "gradient_name",
    "random_inputs",
    "run_graph",
]
