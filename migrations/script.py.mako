"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
${imports if imports else ""}

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}

# An expand step (a new table, a nullable column, an index) leaves compatibility_floor
# alone: the releases before it keep running on the schema. A contract step (it drops or
# changes what an older release uses) adds its row there in upgrade() and deletes it in
# downgrade(): see 0012_compatibility_floor.py.


def upgrade() -> None:
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}
