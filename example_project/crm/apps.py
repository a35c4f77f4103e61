from django.apps import AppConfig


class CrmConfig(AppConfig):
    name = "example_project.crm"
    label = "crm"
    verbose_name = "CRM"
    default_auto_field = "django.db.models.BigAutoField"
