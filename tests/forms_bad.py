"""An eager-style kernel declared with outputs that disagree with its T.empty tensors."""

from forms_ops import add_eager, add_eager_reference

from tileship.declare.spec import Operator, TensorArg

eager_one_output = Operator(name="eager_one_output", factory=add_eager, reference=add_eager_reference,
                            inputs=(TensorArg("A", ("N",)), TensorArg("B", ("N",))), outputs=(TensorArg("C", ("N",)),),
                            dtypes=("float32",), targets=("c",), shapes=({"N": 128},), params={"dtype": None})
