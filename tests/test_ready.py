"""A queue's ready line: serving order across its deque and heap, put-back, stale entries."""

from __future__ import annotations

from itertools import islice

from hypothesis import given, settings
from hypothesis import strategies as st

from master.state.item import Item
from master.state.ready import ReadyLine


def rec(order: int, priority: int = 0, attempts: int = 0) -> Item:
    return Item(priority, order, order, "q", 1, 0, "", ("dn-a",), 0.0, attempts)


def drain(line: ReadyLine) -> list[Item]:
    return list(line.popping())


def test_in_order_arrivals_and_out_of_order_ones_come_out_in_serving_order():
    line = ReadyLine()
    for r in [rec(1), rec(2), rec(5), rec(3), rec(4, priority=-1), rec(6), rec(0)]:
        line.push(r)
    assert len(line) == 7
    assert [(r.priority, r.order) for r in drain(line)] == [
        (-1, 4), (0, 0), (0, 1), (0, 2), (0, 3), (0, 5), (0, 6)]
    assert not line and len(line) == 0


def test_pop_and_popping_agree_and_pop_of_an_empty_line_raises():
    line = ReadyLine([rec(3), rec(1)])
    line.push(rec(2))
    assert [line.pop().id for _ in range(3)] == [1, 2, 3]
    try:
        line.pop()
    except IndexError:
        pass
    else:
        raise AssertionError("an empty line popped something")


def test_popped_entries_put_back_are_the_front_again_in_order():
    line = ReadyLine([rec(i) for i in (1, 2, 3)])
    line.push(rec(0))  # on the heap
    walk = line.popping()
    popped = [next(walk) for _ in range(3)]
    assert [r.id for r in popped] == [0, 1, 2]
    line.put_back(popped)
    line.push(rec(9))
    assert [r.id for r in drain(line)] == [0, 1, 2, 3, 9]


def test_first_live_drops_stale_entries_off_the_front_for_good():
    a, b, c = rec(1), rec(2), rec(3)
    line = ReadyLine([a, b, c])
    items = {2: b, 3: c}  # 1 was forgotten
    items[2] = b._replace(attempts=1)  # 2 has a newer record: its entry is stale
    assert line.first_live(items) is c
    assert len(line) == 1 and line.first_live({}) is None and not line


def test_near_front_holds_the_front_of_each_part():
    line = ReadyLine([rec(i) for i in range(10, 20)])
    for i in (5, 3, 4):
        line.push(rec(i))
    near = line.near_front(2)
    assert min(near).id == 3 and {r.id for r in near} >= {10, 11, 3}


def test_a_checkpoint_s_rows_in_any_order_make_a_sorted_line():
    line = ReadyLine([rec(3), rec(1, priority=2), rec(2)])
    assert [r.id for r in drain(line)] == [2, 3, 1]


ops = st.lists(st.one_of(
    st.tuples(st.just("push"), st.integers(-2, 2), st.integers(0, 60)),
    st.tuples(st.just("walk"), st.integers(0, 8), st.booleans()),
), max_size=80)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_the_line_serves_as_a_sorted_list_would(script):
    # Given a line and a plain sorted list as its model, the same pushes and walks
    line, model, next_id = ReadyLine(), [], 0
    for op in script:
        if op[0] == "push":
            next_id += 1
            r = Item(op[1], op[2], next_id, "q", 1, 0, "", (), 0.0)
            line.push(r)
            model.append(r)
            model.sort()
        else:
            # a walk pops k from the front; put_back returns them, or they are taken for good
            _, k, give_back = op
            popped = list(islice(line.popping(), k))
            assert popped == model[:len(popped)]
            if give_back:
                line.put_back(popped)
            else:
                del model[:len(popped)]
        assert len(line) == len(model)
    # Then the line always served the model's front, and drains as the model
    assert drain(line) == model
